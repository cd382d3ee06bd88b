"""The benchmark sweep on tiny random models: exactly the cells asked, the JSON, valid PNG plots,
a report whose statistics are the CSV's, and the arithmetic of pooling and medians."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import re
from types import SimpleNamespace

import pytest
import torch

from specdemo.services import bench
from specdemo.services.bench import BenchConfig, Run, pool, run_sweep, summarise, write_outputs
from specdemo.services.pipeline import Pipeline
from specdemo.core.stats import DecodeStats
from tiny import CharTokenizer, tiny_llama

VOCAB = 96  # > 64: the auto policy measures forward costs on ids 1..64
PROMPTS = {"grounded": ["the cat sat on the mat. the cat sat on the", "one two one two one two"],
           "chat": ["hello, how are you?", "what is new today?"]}
TASKS = ("grounded", "chat")
LENGTHS = (1, 3, "auto")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def loaded(model, vocab_size=VOCAB):
    """What ``models.load_model`` returns, for an in-process model."""
    return SimpleNamespace(spec=f"tiny-{vocab_size}", model=model, tokenizer=CharTokenizer(),
                           device=torch.device("cpu"), dtype=torch.float32, vocab_size=vocab_size,
                           eos_token_ids=frozenset({0}))


@pytest.fixture(scope="module")
def target():
    return loaded(tiny_llama(seed=0, layers=2, vocab_size=VOCAB))


@pytest.fixture(scope="module")
def sweep(target):
    config = BenchConfig(tasks=TASKS, draft_lengths=LENGTHS, max_new_tokens=12, repeats=2,
                         concurrency=(1, 2))
    return run_sweep(Pipeline(target, "ngram"), PROMPTS, config, show_bar=False)


@pytest.fixture(scope="module")
def outputs(sweep, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    return out, write_outputs(sweep, out)


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_csv_has_exactly_the_cells_asked(outputs):
    out, _ = outputs
    rows = read_csv(out / "bench.csv")
    expected = [(t, str(k), e) for t, k, e in itertools.product(TASKS, LENGTHS, bench.ENGINES)]
    assert [(r["task"], r["draft_length"], r["engine"]) for r in rows] == expected
    statuses = {(r["draft_length"], r["engine"]): r["status"] for r in rows}
    assert statuses[("auto", "transformers")].startswith("n/a: transformers' prompt lookup")
    assert all(s == "ok" for key, s in statuses.items() if key != ("auto", "transformers"))
    for r in rows:
        if r["status"] == "ok":
            assert r["runs"] == "4"  # 2 prompts x 2 repeats
            assert r["prompts"] == "2" and r["repeats"] == "2"
            assert float(r["tokens_per_s"]) > 0 and float(r["plain_tokens_per_s"]) > 0
            assert float(r["speedup_min"]) <= float(r["speedup"]) <= float(r["speedup_max"])


def test_greedy_speculative_output_equals_plain(outputs):
    rows = read_csv(outputs[0] / "bench.csv")
    ours = [r for r in rows if r["engine"] == "specdemo"]
    assert [r["identical"] for r in ours] == ["true"] * len(ours)
    assert [r["identical_runs"] for r in ours] == ["4"] * len(ours)
    # transformers' equality is recorded, whatever it is
    theirs = [r for r in rows if r["engine"] == "transformers" and r["status"] == "ok"]
    assert {r["identical"] for r in theirs} <= {"true", "false"}


def test_json_has_machine_and_the_csv_cells(outputs, sweep):
    out, _ = outputs
    data = json.loads((out / "bench.json").read_text())
    machine = data["machine"]
    for key in ("device", "device_name", "dtype", "torch", "transformers", "cpu_model",
                "cpu_cores_physical", "cpu_cores_logical", "memory_total_bytes",
                "other_processes_cpu_share"):
        assert machine[key] not in (None, ""), key
    assert machine["device"] == "cpu" and machine["dtype"] == "float32"
    assert machine["torch"] == torch.__version__
    rows = read_csv(out / "bench.csv")
    assert len(data["cells"]) == len(rows)
    for cell, row in zip(data["cells"], rows):
        assert {col: bench.fmt(cell.get(col)) for col in bench.CSV_COLUMNS} == row
    assert len(data["runs"]) == len(sweep.runs) > 0
    assert {c["concurrency"] for c in data["concurrency"]} == {1, 2}


@pytest.mark.parametrize("name", ["speedup", "acceptance", "tokens_per_s", "concurrency"])
def test_plots_are_valid_pngs(outputs, name):
    from matplotlib import image
    from PIL import Image
    path = outputs[0] / f"{name}.png"
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(path) as img:
        img.verify()
    pixels = image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100


def report_tables(text: str) -> list[list[dict]]:
    """Every markdown table of the report, as lists of {column: shown value}."""
    tables, current = [], None
    for line in text.splitlines():
        cells = [v.strip() for v in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            current = None
        elif current is None:
            current = {"header": cells, "rows": []}
            tables.append(current)
        elif not set(line) <= set("|-"):
            current["rows"].append(dict(zip(current["header"], cells)))
    return [t["rows"] for t in tables]


def test_report_statistics_equal_the_csv(outputs):
    out, paths = outputs
    text = (out / "report.md").read_text()
    rows = read_csv(out / "bench.csv")
    by_key = {(r["task"], r["draft_length"], r["engine"]): r for r in rows}
    results, versus, concurrency = report_tables(text)
    assert len(results) == len(rows)
    assert len(versus) == sum(r["engine"] == "specdemo" and r["status"] == "ok" for r in rows)
    for shown in results + versus:
        row = by_key[(shown["task"], shown["draft_length"], shown["engine"])]
        for col, value in shown.items():
            assert value == row[col].replace("|", "/"), (col, value, row[col])
    assert concurrency == read_csv(out / "concurrency.csv")
    for name in ("speedup", "acceptance", "tokens_per_s", "concurrency"):
        assert f"]({name}.png)" in text
    # the best draft length per task, recomputed from the CSV alone
    for engine in bench.ENGINES:
        for task in TASKS:
            measured = [r for r in rows if (r["engine"], r["task"]) == (engine, task) and r["speedup"]]
            best = max(measured, key=lambda r: float(r["speedup"]))
            k, s = best["draft_length"], best["speedup"]
            expected = f"k={k} ({s}x)" if float(s) >= 1 else f"best was k={k} at {s}x"
            line = next(line for line in text.splitlines() if line.startswith(f"- **{engine}**"))
            assert re.search(rf"{task}: [^;]*{re.escape(expected)}", line), (line, expected)


def test_concurrency_rows(outputs):
    rows = read_csv(outputs[0] / "concurrency.csv")
    assert [(r["concurrency"], r["mode"]) for r in rows] == [
        ("1", "plain_batched"), ("1", "speculative_sequential"),
        ("2", "plain_batched"), ("2", "speculative_sequential")]
    for plain, spec in zip(rows[::2], rows[1::2]):
        ratio = float(spec["total_tokens_per_s"]) / float(plain["total_tokens_per_s"])
        assert float(spec["speculative_over_batched_plain"]) == pytest.approx(ratio, rel=1e-3)
        assert spec["draft_length"] in [str(k) for k in LENGTHS]
        assert int(plain["outputs_equal_speculative"]) <= int(plain["concurrency"])


# --- arithmetic on hand-made runs ---------------------------------------------------------------

def make_run(new_tokens, elapsed_s, draft_length=None, drafted=0, accepted=0, rounds=0, repeat=0):
    run = Run("specdemo", "t", 0, repeat, draft_length, new_tokens, elapsed_s, ttft_s=0.5,
              draft_s=0.1, verify_s=0.2, peak_memory_bytes=100, extra_memory_bytes=0)
    run.drafted, run.accepted, run.rounds, run.round_tokens = drafted, accepted, rounds, new_tokens - 1
    return run


def test_pool_sums_before_dividing():
    plain = [make_run(10, 2.0), make_run(20, 2.0)]
    spec = [make_run(10, 1.0, 4, drafted=8, accepted=6, rounds=3),
            make_run(20, 1.0, 4, drafted=12, accepted=3, rounds=13)]
    m = pool(plain, spec)
    assert m["plain_tokens_per_s"] == 7.5 and m["tokens_per_s"] == 15.0 and m["speedup"] == 2.0
    assert m["acceptance_rate"] == 9 / 20
    assert m["mean_acceptance_length"] == 28 / 16
    assert m["draft_s"] == pytest.approx(0.2) and m["verify_s"] == pytest.approx(0.4)


def test_pool_without_drafting_reports_none():
    m = pool([make_run(10, 1.0)], [make_run(10, 1.0, "auto")])
    assert m["acceptance_rate"] is None and m["mean_acceptance_length"] is None
    assert m["per_position_acceptance"] == [] and m["speedup"] == 1.0


def test_summarise_median_min_max_over_repeats():
    per_repeat = [{"speedup": s, "per_position_acceptance": p, "new_tokens": n}
                  for s, p, n in ((1.0, [1.0, 0.5], 30), (3.0, [0.0], 10), (2.0, [0.5, None], 20))]
    out = summarise(per_repeat)
    assert (out["speedup"], out["speedup_min"], out["speedup_max"]) == (2.0, 1.0, 3.0)
    assert out["per_position_acceptance"] == [0.5, 0.5]
    assert out["new_tokens"] == 20


def test_record_round_matches_engine_stats():
    run, stats = make_run(1, 1.0), DecodeStats()
    for drafted, accepted in ((4, 4), (4, 1), (2, 0), (0, 0), (5, 3)):
        run.record_round(drafted, accepted, accepted + 1)
        stats.record_round(drafted, accepted)
    assert run.position_drafted == stats.position_drafted
    assert run.position_accepted == stats.position_accepted


# --- the reference column for model drafters ------------------------------------------------------

@pytest.mark.parametrize("spec", ["self", "early-exit:1"])
def test_reference_assists_with_the_same_model(target, spec):
    config = BenchConfig(tasks=("grounded",), draft_lengths=(2, "auto"), max_new_tokens=6,
                         prompts_per_task=1)
    before = target.model.generation_config.to_dict()
    result = run_sweep(Pipeline(target, spec), PROMPTS, config, show_bar=False)
    assert target.model.generation_config.to_dict() == before  # assistant settings restored
    cells = {(c["draft_length"], c["engine"]): c for c in result.cells}
    assert all(c["status"] == "ok" for c in cells.values())
    assert "num_assistant_tokens=2" in cells[(2, "transformers")]["method"]
    assert "heuristic" in cells[("auto", "transformers")]["method"]
    assert cells[(2, "specdemo")]["identical"] is True
    if spec == "self":  # the target drafting for itself accepts everything, in both engines
        assert cells[(2, "specdemo")]["acceptance_rate"] == 1.0
        assert cells[(2, "transformers")]["acceptance_rate"] == 1.0
        assert cells[(2, "transformers")]["per_position_acceptance"] == [1.0, 1.0]


def test_reference_refusal_is_recorded_not_raised(target):
    """transformers decides 'same tokenizer' by vocabulary size and refuses a padded draft;
    our engine runs it. The cell says why instead of the sweep failing."""
    draft = loaded(tiny_llama(seed=5, layers=1, vocab_size=VOCAB + 32), VOCAB + 32)
    config = BenchConfig(tasks=("chat",), draft_lengths=(2,), max_new_tokens=8, prompts_per_task=1)
    result = run_sweep(Pipeline(target, "tiny-draft", draft), PROMPTS, config, show_bar=False)
    ours, ref = result.cells
    assert ours["engine"] == "specdemo" and ours["status"] == "ok" and ours["identical"] is True
    assert ref["engine"] == "transformers" and ref["status"].startswith("error: ValueError")
    assert "tokenizer" in ref["status"]


def test_no_reference_and_progress_callback(target):
    seen = []
    config = BenchConfig(tasks=("chat",), draft_lengths=(2, 4), max_new_tokens=6,
                         prompts_per_task=2, reference=False)
    result = run_sweep(Pipeline(target, "ngram"), PROMPTS, config, show_bar=False,
                       progress=lambda done, total, desc: seen.append((done, total)))
    assert [(c["draft_length"], c["engine"]) for c in result.cells] == [(2, "specdemo"), (4, "specdemo")]
    assert seen == [(i, 6) for i in range(1, 7)]  # 2 prompts x (plain + 2 draft lengths)


# --- settings and command line ------------------------------------------------------------------

def test_parsing_and_validation():
    assert bench.parse_draft_lengths("1, 2,auto,2") == (1, 2, "auto")
    assert bench.parse_ints("1,2,4,8") == (1, 2, 4, 8)
    for bad in ("0", "x", "65"):
        with pytest.raises(ValueError, match="draft length"):
            bench.parse_draft_lengths(bad)
    with pytest.raises(ValueError, match="no tasks"):
        BenchConfig(tasks=())
    with pytest.raises(ValueError, match="concurrency"):
        BenchConfig(concurrency=(0,))


def test_sweep_refuses_plain_only(target):
    with pytest.raises(ValueError, match="give a draft"):
        run_sweep(Pipeline(target, "none"), PROMPTS, BenchConfig(tasks=("chat",)), show_bar=False)


def test_the_reference_column_is_announced_with_an_estimate(target):
    lines = []
    config = BenchConfig(tasks=("chat",), draft_lengths=(2, 3), max_new_tokens=16,
                         prompts_per_task=2, repeats=2)
    run_sweep(Pipeline(target, "ngram"), PROMPTS, config, show_bar=False, note=lines.append)
    assert len(lines) == 1  # 2 repeats x 2 prompts x (plain + 2 draft lengths)
    assert lines[0].startswith("reference column: 12 decodes through transformers' generate() ")
    # the estimate scales the warm-up (3 decodes of 8 tokens) to 12 decodes of 16 tokens
    assert bench.reference_estimate_s(config, 12, warm_up_s=1.5, warm_up_decodes=3) == 12.0
    quiet = []
    run_sweep(Pipeline(target, "ngram"), PROMPTS, dataclasses.replace(config, reference=False),
              show_bar=False, note=quiet.append)
    assert quiet == []


def test_bench_run_and_compare_default_to_auto_and_bench_to_no_reference(tmp_path):
    from specdemo.interfaces.cli import build_parser
    t = str(tmp_path)
    parser = build_parser()
    bench_args = parser.parse_args(["bench", "--target", t, "--out", "x"])
    assert bench_args.backend == "auto" and bench_args.reference is False
    assert parser.parse_args(["bench", "--target", t, "--out", "x", "--reference"]).reference
    for command in ("run", "compare"):
        assert parser.parse_args([command, "--prompt", "hi"]).backend == "auto"
    assert parser.parse_args(["run", "--prompt", "hi", "--backend", "transformers"]).backend == \
        "transformers"


def test_cli_parser_and_preset_conflict(tmp_path):
    from specdemo.interfaces.bench_cli import resolve_models
    from specdemo.interfaces.cli import build_parser
    t = str(tmp_path)  # a local folder: passes the flag's check; nothing is loaded here
    args = build_parser().parse_args(["bench", "--preset", "p", "--target", t, "--out", "x"])
    with pytest.raises(ValueError, match="either --preset or --target"):
        resolve_models(args)
    args = build_parser().parse_args(["bench", "--target", t, "--draft", "self", "--out", "x",
                                      "--draft-lengths", "2,auto", "--concurrency", "1,4"])
    assert resolve_models(args) == (t, "self", "auto", None)
    assert args.draft_lengths == "2,auto" and args.concurrency == "1,4"


# --- the Benchmark tab ----------------------------------------------------------------------------

def test_benchmark_tab_builds_and_runs(target, monkeypatch, tmp_path):
    import gradio as gr
    from specdemo.interfaces import bench_ui

    class Cache:
        def get(self, target_spec, draft, dtype, quantization):
            return Pipeline(target, draft)

    monkeypatch.setattr(bench_ui, "_PIPELINES", Cache())
    monkeypatch.setattr(bench_ui, "load_prompts", lambda tasks: {t: PROMPTS[t] for t in tasks})
    with gr.Blocks():
        tab = bench_ui.build_benchmark_tab()
    assert tab.run.elem_id == "bench-run"
    steps = []
    out = bench_ui.run_benchmark(None, "tiny", "ngram", ["chat"], ["2", "auto"], 8, 1, 1, 0.0,
                                 True, ["1"], progress=lambda *a, **k: steps.append(a))
    summary, table, speedup_fig, acceptance_fig, tokens_fig, concurrency_plot, csv_path, report = out
    rows = read_csv(csv_path)
    assert table.values.tolist() == [[bench_ui.table_cell(c, _number(r[c])) for c in bench_ui.TABLE_COLUMNS]
                                     for r in rows]
    assert "Best draft length" in summary and "chat:" in summary
    assert all(hasattr(f, "savefig") for f in (speedup_fig, acceptance_fig, tokens_fig))
    assert concurrency_plot.visible is True
    # ours: plain, k=2, auto; transformers: plain, k=2 (auto is n/a); concurrency 1: batch + 1 request
    assert steps[-1][0] == (7, 7)
    with pytest.raises(gr.Error, match="no tasks"):
        bench_ui.run_benchmark(None, "tiny", "ngram", [], ["2"], 8, 1, 1, 0.0, True, [],
                               progress=lambda *a, **k: None)


def _number(text: str):
    """A CSV cell back as the float it was written from (else the text)."""
    try:
        return float(text) if "." in text else text
    except ValueError:
        return text


@pytest.mark.slow
def test_benchmark_tab_reads_well(target, monkeypatch, tmp_path):
    """Issue 20.11: no "loading" with the models loaded; the speedup plot's title fits and a
    single point sits on its tick; sensible decimals; headers break only at underscores; a time
    estimate for the default sweep; no specdemo-bench-* folder left in the temp directory."""
    import tempfile
    from pathlib import Path

    import gradio as gr

    from specdemo.interfaces import bench_ui
    pipe = Pipeline(target, "ngram")

    class Cache:
        def get(self, target_spec, draft, dtype, quantization):
            return pipe

        def loaded(self, target_spec, draft, dtype, quantization):
            return pipe

    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(bench_ui, "_PIPELINES", Cache())
    monkeypatch.setattr(bench_ui, "load_prompts", lambda tasks: {t: PROMPTS[t] for t in tasks})
    monkeypatch.setattr(bench_ui, "_SECONDS_PER_TOKEN", [])
    with gr.Blocks():
        tab = bench_ui.build_benchmark_tab()
    # the default sweep: 5 tasks x 2 prompts x (ours: plain + 5 lengths; transformers: plain + 4)
    rate, _ = bench_ui.seconds_per_token()
    minutes = round(110 * 64 * rate / 60)
    assert tab.estimate.value.startswith(
        f"This sweep: 110 decodes of up to 64 new tokens; at most about {minutes} min at ")
    before = set(Path(tempfile.gettempdir()).glob("specdemo-bench-*"))
    descs = []
    out = bench_ui.run_benchmark(None, "tiny", "ngram", ["chat"], ["2"], 8, 1, 1, 0.0, False, [],
                                 progress=lambda *a, desc="": descs.append(desc))
    assert set(Path(tempfile.gettempdir()).glob("specdemo-bench-*")) == before
    assert Path(out[6]).parent == tmp_path / "cache" / "benchmark-tab"
    assert not descs[0].startswith("loading") and "loaded" in descs[0]
    # decimals: tokens/s 1, ratios 2; headers: the CSV names, breakable at underscores only
    table = out[1]
    row = dict(zip(bench_ui.TABLE_COLUMNS, table.values.tolist()[0]))
    assert re.fullmatch(r"\d+\.\d", row["tokens_per_s"]) and re.fullmatch(r"\d+\.\d\d", row["speedup"])
    assert [h.replace("\u200b", "") for h in table.columns] == list(bench_ui.TABLE_COLUMNS)
    assert all(part.endswith("_") for h in table.columns for part in h.split("\u200b")[:-1])
    # one draft length, one engine: the point sits on its tick; a long title inside the figure
    from specdemo.services.bench.report import speedup_figure
    sweep = SimpleNamespace(
        target="builtin:smollm2-135m", draft="builtin:smollm2-135m-eagle3+ngram",
        config=SimpleNamespace(draft_lengths=(2,), tasks=("chat",), engines=("specdemo",)),
        cells=[{"task": "chat", "draft_length": 2, "engine": "specdemo", "status": "ok",
                "speedup": 1.2, "speedup_min": 1.1, "speedup_max": 1.3}])
    figure = speedup_figure(sweep)
    ax = figure.axes[0]
    figure.canvas.draw()
    xs = [x for line in ax.lines for x in line.get_xdata() if line.get_marker() == "o"]
    assert xs == [0] and list(ax.get_xticks()) == [0]
    box, page = ax.title.get_window_extent(), figure.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and box.y1 <= page.y1
    assert "builtin:smollm2-135m-eagle3+ngram" in ax.get_title()


def test_the_summary_names_the_backend_the_sweep_ran_on(sweep):
    assert bench.summary_text(sweep).splitlines()[0].startswith(
        f"tiny-{VOCAB} + ngram on cpu (float32), ")
    on_native = dataclasses.replace(sweep, machine={**sweep.machine, "backend": "native-w8a8"})
    assert "on cpu (backend native-w8a8), " in bench.summary_text(on_native).splitlines()[0]


def test_the_server_sweep_says_a_server_that_is_not_there_in_one_line(tmp_path, capsys):
    """``bench`` with server lanes (the concurrency sweep, run from interfaces/bench_cli.py): a
    server that refuses the connection is one sentence and exit status 2, nothing written."""
    from specdemo.interfaces.cli import main
    status = main(["bench", "--plain-endpoint", "http://127.0.0.1:9", "--spec-endpoint",
                   "http://127.0.0.1:9", "--concurrency", "1", "--tasks", "chat",
                   "--out", str(tmp_path / "o")])
    assert status == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: could not connect to http://127.0.0.1:9: connection refused or host unreachable "
        "(is the server running?)")
    assert not (tmp_path / "o").exists()
