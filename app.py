"""Launch the side-by-side chat app: ``python app.py [--host H] [--port P] [--no-browser] [--preset NAME] [--share]``.

Thin on purpose: parse flags, build the page (``specdemo.ui``), launch it. The default preset's
models load in the background, so the page answers at once.
"""

from __future__ import annotations

import argparse
import os
import threading

# Before gradio is imported: no usage analytics (and no version check that comes with them).
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Race plain and speculative decoding side by side.")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default %(default)s: this machine only)")
    parser.add_argument("--port", type=int, default=None, help="port (default: gradio's, 7860 or next free)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    parser.add_argument("--preset", default=None, help="preset to start with (default: the default preset)")
    parser.add_argument("--share", action="store_true",
                        help="also publish a public gradio.live link (off by default)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from specdemo import race, ui

    # This (main) thread runs every load and decode, as `python -m specdemo compare` does, so the
    # race measures what compare measures; the server runs on gradio's threads.
    race.DEVICE.adopt_current_thread()
    demo = ui.build_ui(args.preset, host=args.host, share=args.share)
    ui.launch(demo, host=args.host, port=args.port, inbrowser=not args.no_browser,
              share=args.share, prevent_thread_lock=True)
    threading.Thread(target=ui.preload, args=(args.preset,), name="preload", daemon=True).start()
    try:
        race.DEVICE.serve_forever()
    except KeyboardInterrupt:
        demo.close()


if __name__ == "__main__":
    main()
