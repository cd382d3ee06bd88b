"""Issue 20 item 6, as a benchmark (a speed bound is not a test assertion here): is the first
race's speedup an artefact of what still warms up?

The real app on the built-in model, built in-process and driven through ``/race`` with
gradio_client, as the page's first race runs: the preload reaches Ready, the page then starts
its draft-list checks (``check_drafts``, as ``demo.load(...).then(check_drafts)`` does), and the
first prompt is sent at once; then the same prompt again, ``--races - 1`` times. Prints every
race's tokens/s, TTFT and other processes' CPU share per lane, the first speedup over the median
of the later ones, and the later ones' own spread (the noise a single race has here); exits 1 when
the first is off the later median by more than TOLERANCE (the issue's 15%) and outside the later
races' own range (on this 2-core machine, quiet, one race's speedup of one prompt spans about
0.83-1.23x: a 15% bound alone is inside that noise), 3 when a race reports a busy machine
(the app's own rule: such a speedup is not reliable). What is warmed before the clocks is tested
in tests/test_warmup.py.

The app's settings are built from these flags (an ``AppSettings``, ``--backend`` as app.py's,
default ``auto``) and passed to the preload and the page as app.py passes them; the output says
which backend the races ran on (``backend`` in ``--json``: the setting and what ``auto`` chose).

    python scripts/first_race.py [--max-new-tokens 64] [--races 4] [--prompt TEXT] [--backend auto] [--json]
"""

import argparse
import json
import os
import socket
import statistics
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


def settings_of(args: argparse.Namespace):
    """The app's settings for this run (the default preset, ``--backend``), as app.py builds
    them from its flags."""
    from specdemo.interfaces.ui_state import AppSettings
    return AppSettings(backend=args.backend)


def summary(races: list[dict], setting: str) -> dict:
    """What ``--json`` prints of ``/race`` answers (at least two): per race each lane's
    tokens/s, TTFT (s) and other processes' CPU share, the speedup, identity and warnings; the
    backend asked for (``setting``) and the one each race ran on; the first speedup over the
    median of the later ones and the later ones' spread (max/min - 1)."""
    seen = {"backend": {"setting": setting, "ran_on": sorted({str(r["backend"]) for r in races})},
            "races": [{lane: {k: r[lane][k] for k in ("tokens_per_s", "ttft_s", "other_cpu_share")}
                       for lane in ("plain", "speculative")}
                      | {"backend": r["backend"], "speedup": r["speedup"],
                         "identical": r["identical"], "warnings": r["warnings"]}
                      for r in races]}
    later = sorted(r["speedup"] for r in races[1:])
    seen["first_over_later_median"] = races[0]["speedup"] / statistics.median(later)
    seen["later_spread"] = later[-1] / later[0] - 1  # max/min - 1 among the later races
    return seen


def main(argv: list[str] | None = None) -> int:
    from specdemo.core import BACKENDS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--races", type=int, default=4, help="races of the prompt, first included (>= 2)")
    parser.add_argument("--prompt", default=PROMPT, help="the prompt every race sends (default: a sentence to repeat)")
    parser.add_argument("--backend", default="auto", choices=BACKENDS,
                        help="the targets' forward backend, as app.py's --backend (default %(default)s)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from gradio_client import Client

    from specdemo.interfaces import ui, ui_state
    app = settings_of(args)  # passed down as app.py passes its settings
    port = free_port()
    demo = ui.build_ui(app)
    ui.launch(demo, host="127.0.0.1", port=port, prevent_thread_lock=True)
    try:
        preset = ui_state._default_preset_name(None, app)
        if not ui_state.start_preload(preset, app).wait(1800) or ui_state._PRELOAD["error"]:
            print(f"the preload did not finish: {ui_state._PRELOAD['error']}", file=sys.stderr)
            return 2
        threading.Thread(target=ui.check_drafts, args=(preset, None), daemon=True).start()
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        races = [client.predict(api_name="/race", prompt=args.prompt, max_new_tokens=args.max_new_tokens)
                 for _ in range(max(2, args.races))]
    finally:
        demo.close()
    seen = summary(races, args.backend)
    later = sorted(r["speedup"] for r in races[1:])
    ratio = seen["first_over_later_median"]
    if not args.json:
        print(f"backend {args.backend}: the races ran on {', '.join(seen['backend']['ran_on'])}")
        for i, r in enumerate(races):
            print(f"race {i + 1}: plain {r['plain']['tokens_per_s']:.2f} tok/s, speculative "
                  f"{r['speculative']['tokens_per_s']:.2f} tok/s, speedup {r['speedup']:.3f}, "
                  f"{'identical' if r['identical'] else 'outputs differ'}"
                  + (f"  ({'; '.join(r['warnings'])})" if r["warnings"] else ""))
        print(f"first / median of later = {ratio:.3f}; later races' spread {seen['later_spread']:.1%}")
    print(json.dumps(seen, indent=None if args.json else 1))
    if any(r["warnings"] for r in races):
        return 3
    inside = later[0] <= races[0]["speedup"] <= later[-1]
    return 0 if abs(ratio - 1) <= TOLERANCE or inside else 1


if __name__ == "__main__":
    sys.exit(main())
