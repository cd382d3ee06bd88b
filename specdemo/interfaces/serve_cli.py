"""``serve`` subcommand: run llama.cpp's ``llama-server`` on a GGUF model (the server:
``services/serve.py``)"""

from __future__ import annotations

import signal
import sys
import time

from ..services import serve
from ..services.presets import default_target


def register(sub) -> None:
    parser = sub.add_parser("serve", help="run llama.cpp's llama-server on a GGUF model (a lane "
                                          "for compare --plain-endpoint/--spec-endpoint)")
    parser.add_argument("engine", choices=list(serve.ENGINES))
    parser.add_argument("--model", default=default_target(),
                        help="builtin:<name> or a .gguf path (default %(default)s)")
    parser.add_argument("--draft", default="none",
                        help="none, ngram (prompt lookup: ngram-simple), another of llama-server's n-gram "
                             "types (ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache), "
                             "builtin:<name> or a .gguf draft model "
                             "(default %(default)s)")
    parser.add_argument("--draft-max", type=int, default=None,
                        help="most draft tokens per round (llama-server --spec-draft-n-max)")
    parser.add_argument("--port", type=int, default=8080, help="(default %(default)s; 0: any free)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="server slots: requests decoded at once (default %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: llama-server's)")
    parser.add_argument("--ctx-size", type=int, default=4096, help="(default %(default)s)")
    parser.set_defaults(func=cmd_serve)


def cmd_serve(args) -> int:
    if args.parallel < 1 or (args.draft_max is not None and args.draft_max < 1):
        print("error: --parallel and --draft-max must be 1 or more", file=sys.stderr)
        return 2
    try:
        server = serve.LlamaServer(args.model, args.draft, args.port, args.parallel,
                                   args.threads, args.ctx_size, args.draft_max)
        url = server.start()
    except serve.ServeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:  # from here on a Ctrl-C (even during the prints) stops the server it started
        print(f"llama-server ({args.model}, draft {args.draft}, {args.parallel} slot(s)) ready at {url}",
              flush=True)
        print(f"race it: python -m specdemo compare --spec-endpoint {url} --prompt ...   "
              f"(Ctrl-C stops it; log: {server.log_path})", flush=True)
        while server.running:
            time.sleep(0.5)
        print(f"error: llama-server exited: {server.log_tail()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("stopping llama-server", file=sys.stderr)
        return 0
    finally:
        server.stop()
