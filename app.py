"""Launch the side-by-side chat app: ``python app.py [--host H] [--port P] [--no-browser] [--preset NAME] [--share]``.

Thin on purpose: parse flags into the app's settings (one ``AppSettings``, passed down), start
loading the preset's models, build the page
(``specdemo.interfaces.ui``) and launch it. The models load on this (main) thread while another thread
imports gradio and serves the page (model work releases the GIL, so the two overlap); the page
shows each slow step with a progress bar, and the same steps are printed here.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import traceback

# Before gradio is imported: no usage analytics (and no version check that comes with them).
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"


def preset_arg(name: str) -> str:
    """A preset that exists (the message lists the valid names, as the /race API does)."""
    from specdemo.checks import inputs
    from specdemo.services.presets import PresetError, list_presets
    try:
        names = [p.name for p in list_presets()]
    except PresetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    try:
        return inputs.preset(name, names)
    except inputs.InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The app's flags. A refusal is the command line's (``interfaces.cli.Parser``): one line,
    ``error: <why>`` (a mistyped flag with the one it looks like: ``--prot`` ... did you mean
    --port?), then ``(python app.py --help)``; exit status 2, no usage block.

    Raises:
        SystemExit: 2 for a refused flag or value, 0 after ``--help``.
    """
    from specdemo.core import BACKENDS
    from specdemo.interfaces.cli import Parser  # no torch: argparse and the input checks
    parser = Parser(prog="python app.py",
                    description="Race plain and speculative decoding side by side.")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default %(default)s: this machine only)")
    parser.add_argument("--port", type=int, default=None, help="port (default: gradio's, 7860 or next free)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    parser.add_argument("--preset", default=None, type=preset_arg,
                        help="preset to start with (default: the default preset)")
    parser.add_argument("--share", action="store_true",
                        help="also publish a public gradio.live link (off by default)")
    parser.add_argument("--backend", default="auto",
                        choices=BACKENDS,
                        help="target forward for both lanes: auto (default: on a CPU, every "
                             "backend available for the target is timed once on this machine and "
                             "the cheapest kept; the start-up steps say which and why; "
                             "transformers on a GPU), transformers (the float32 reference), native "
                             "(our C forward with BF16 weights), native-int8 (the same with int8 "
                             "weights), native-w8a8 (int8 weights and int8 activations), ggml (llama.cpp over a "
                             "GGUF/built-in target), ggml-bf16 (its BF16 copy) or int8 (int8 "
                             "Llama forward)")
    return parser.parse_args(argv)


def settings_of(args: argparse.Namespace):
    """The app's settings from its flags: the one object the page and the preload are given."""
    from specdemo.interfaces.ui_state import AppSettings
    return AppSettings(preset=args.preset, backend=args.backend, host=args.host, port=args.port,
                       share=args.share, open_browser=not args.no_browser)


def serve_page(app, served: list, failed: threading.Event) -> None:
    """Import gradio, build the page for the app's settings and launch it (on a thread of its
    own). If that fails (a port in use, say), the error is printed and ``failed`` is set: no
    app without its page."""
    try:
        from specdemo.interfaces import ui
        demo = ui.build_ui(app)
        ui.launch(demo, host=app.host, port=app.port, inbrowser=app.open_browser,
                  share=app.share, prevent_thread_lock=True)
        served.append(demo)
    except BaseException:
        traceback.print_exc()
        failed.set()


def say_when_ready(ready: threading.Event) -> None:
    ready.wait()
    print("ready: send a prompt", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    app = settings_of(parse_args(argv))
    from specdemo.services import race, startup
    from specdemo.interfaces import ui_state
    from specdemo.interfaces.cli import quiet_library_logs
    quiet_library_logs()

    # This (main) thread runs every load and decode, as `python -m specdemo compare` does, so the
    # race measures what compare measures; the server runs on gradio's threads.
    race.DEVICE.adopt_current_thread()
    served: list = []
    failed = threading.Event()
    threading.Thread(target=serve_page, args=(app, served, failed), name="page",
                     daemon=True).start()
    ready = ui_state.start_preload(app.preset, app)
    threading.Thread(target=say_when_ready, args=(ready,), name="ready", daemon=True).start()
    try:
        with startup.printed():
            race.DEVICE.serve_forever(stop=failed)
    except KeyboardInterrupt:
        for demo in served:
            demo.close()
    if failed.is_set():
        raise SystemExit(1)  # the page could not be served (printed above)


if __name__ == "__main__":
    main()
