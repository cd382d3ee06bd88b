"""Issue 20 item 6: the first race's speedup is not an artefact of what still warms up.

The real app on the built-in model, built in-process and driven through ``/race`` with
gradio_client, as the page's first race runs: the preload reaches Ready, the page then starts
its draft-list checks (``check_drafts``, as ``demo.load(...).then(check_drafts)`` does), and the
first prompt is sent at once. Its speedup must match a second race of the same prompt within
TOLERANCE (the issue's 15%). When either race reports a busy machine (its ``warnings``: other
processes took more than a quarter of the CPU), the test is skipped with the figures: the app
itself calls such a speedup not reliable. Before the fix the plain lane of a first race paid one-time costs
(first forwards of a shape, a draft check in a thread) that the speculative lane did not:
1.14x against 0.81x in a fresh session.
"""

import os
import socket
import threading

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"

TOLERANCE = 0.15  # |first speedup / second speedup - 1|, the bound
PROMPT = "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog by the river."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_first_race_speedup_is_within_15_percent_of_the_second():
    from gradio_client import Client

    from specdemo.interfaces import ui, ui_state
    port = free_port()
    demo = ui.build_ui()
    ui.launch(demo, host="127.0.0.1", port=port, prevent_thread_lock=True)
    try:
        preset = ui_state._default_preset_name(None)
        assert ui_state.start_preload(preset).wait(1800), "the preload did not finish"
        assert ui_state._PRELOAD["error"] is None, ui_state._PRELOAD["error"]
        # Ready: the page now checks its draft list in the background; the prompt goes at once.
        threading.Thread(target=ui.check_drafts, args=(preset, None), daemon=True).start()
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        first = client.predict(api_name="/race", prompt=PROMPT, max_new_tokens=64)
        second = client.predict(api_name="/race", prompt=PROMPT, max_new_tokens=64)
    finally:
        demo.close()
    for result in (first, second):
        assert result["plain"]["status"] == result["speculative"]["status"] == "done"
        assert result["identical"] is True  # float32 built-in preset: lossless
    seen = {name: {lane: (r[lane]["tokens_per_s"], r[lane]["ttft_s"], r[lane]["other_cpu_share"])
                   for lane in ("plain", "speculative")} | {"speedup": r["speedup"]}
            for name, r in (("first", first), ("second", second))}
    ratio = first["speedup"] / second["speedup"]
    if first["warnings"] or second["warnings"]:
        # The app's own rule: a speedup timed while other processes took more than a quarter of
        # the CPU is not reliable, so it cannot tell a first-race artefact from the noise (on a
        # shared 2-core machine at ~90% other use, two runs of this test gave 1.21 and 0.37).
        pytest.skip(f"machine busy during a race ({first['warnings'] + second['warnings']}); "
                    f"first/second speedup {ratio:.3f}: {seen}")
    assert abs(ratio - 1) <= TOLERANCE, f"first/second speedup {ratio:.3f}: {seen}"
