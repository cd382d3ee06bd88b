"""Issue 20 item 6, as a benchmark (a speed bound is not a test assertion here): is the first
race's speedup an artefact of what still warms up?

The real app on the built-in model, built in-process and driven through ``/race`` with
gradio_client, as the page's first race runs: the preload reaches Ready, the page then starts
its draft-list checks (``check_drafts``, as ``demo.load(...).then(check_drafts)`` does), and the
first prompt is sent at once; then the same prompt again. Prints both races' tokens/s, TTFT and
other processes' CPU share per lane, and the ratio of the two speedups; exits 1 when it is off by
more than TOLERANCE (the issue's 15%), 3 when a race reports a busy machine (the app's own rule:
such a speedup is not reliable). What is warmed before the clocks is tested in
tests/test_warmup.py.

    python scripts/first_race.py [--max-new-tokens 64] [--json]
"""

import argparse
import json
import os
import socket
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"

TOLERANCE = 0.15  # |first speedup / second speedup - 1|, the bound
PROMPT = "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog by the river."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from gradio_client import Client

    from specdemo.interfaces import ui, ui_state
    port = free_port()
    demo = ui.build_ui()
    ui.launch(demo, host="127.0.0.1", port=port, prevent_thread_lock=True)
    try:
        preset = ui_state._default_preset_name(None)
        if not ui_state.start_preload(preset).wait(1800) or ui_state._PRELOAD["error"]:
            print(f"the preload did not finish: {ui_state._PRELOAD['error']}", file=sys.stderr)
            return 2
        threading.Thread(target=ui.check_drafts, args=(preset, None), daemon=True).start()
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        first = client.predict(api_name="/race", prompt=PROMPT, max_new_tokens=args.max_new_tokens)
        second = client.predict(api_name="/race", prompt=PROMPT, max_new_tokens=args.max_new_tokens)
    finally:
        demo.close()
    seen = {name: {lane: {k: r[lane][k] for k in ("tokens_per_s", "ttft_s", "other_cpu_share")}
                   for lane in ("plain", "speculative")} | {"speedup": r["speedup"], "warnings": r["warnings"]}
            for name, r in (("first", first), ("second", second))}
    ratio = first["speedup"] / second["speedup"]
    seen["first_over_second"] = ratio
    print(json.dumps(seen, indent=None if args.json else 1))
    if first["warnings"] or second["warnings"]:
        return 3
    return 0 if abs(ratio - 1) <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
