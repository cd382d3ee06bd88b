"""Issue 11 item 6: the Benchmark tab measures on the device thread (where the race and the
CLI's decodes run), not on a gradio worker thread, and its progress still reaches the page."""

import threading

import pytest

from specdemo.interfaces import bench_ui
from specdemo.services.race import DEVICE


def test_benchmark_sweep_runs_on_the_device_thread_with_progress(monkeypatch):
    seen = {}

    class Cache:
        def get(self, target, draft, dtype, quantization):
            return object()

    def run_sweep(pipe, prompts, config, show_bar, progress):
        seen["on_device"] = DEVICE.on_device()
        seen["thread"] = threading.current_thread().name
        for done in range(1, 4):
            progress(done, 3, f"cell {done}")
        raise RuntimeError("stop here: the sweep's outputs are tested in test_bench.py")

    monkeypatch.setattr(bench_ui, "_PIPELINES", Cache())
    monkeypatch.setattr(bench_ui, "load_prompts", lambda tasks: {t: ["hi"] for t in tasks})
    monkeypatch.setattr(bench_ui.bench, "run_sweep", run_sweep)
    updates, caller = [], threading.current_thread()

    def progress(fraction, desc=""):
        updates.append((fraction, desc, threading.current_thread() is caller))
    try:
        bench_ui.run_benchmark(None, "tiny", "ngram", ["chat"], ["2"], 8, 1, 1, 0.0, False, [],
                               progress=progress)
    except Exception as exc:  # gr.Error with the sweep's message
        assert "stop here" in str(exc)
    assert seen["on_device"] is True and seen["thread"] != caller.name
    # progress calls made on the device thread arrive on the handler's thread, in order
    assert updates[0][1] == "loading tiny + ngram"
    assert updates[1][1] == "warming up (untimed), then the first decode"
    assert updates[2:] == [((1, 3), "cell 1", True), ((2, 3), "cell 2", True), ((3, 3), "cell 3", True)]


def test_a_benchmark_of_a_pairing_the_page_has_not_loaded_runs_on_the_apps_backend(monkeypatch):
    """The Benchmark tab hands the app's --backend to the pipeline cache (it used to set a
    module-level default); without one the cache's own default stands."""
    asked = []

    class Cache:
        def get(self, target, draft, dtype, quantization, **kw):
            asked.append(kw.get("backend"))
            raise RuntimeError("stop here")
    monkeypatch.setattr(bench_ui, "pipelines", lambda: Cache())
    for backend in ("native-w8a8", None):
        with pytest.raises(Exception, match="stop here"):
            bench_ui.run_benchmark(None, "tiny", "ngram", ["chat"], ["2"], 8, 1, 1, 0.0, False, [],
                                   backend=backend, progress=lambda *a, **k: None)
    assert asked == ["native-w8a8", None]
