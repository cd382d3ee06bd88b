"""The page's draft-list checks in a child process that stops while a race runs.

The draft dropdown lists only drafts that fit the target, so the page checks every candidate
model draft's tokenizer (``compat.check_specs``). A first check can take a minute of CPU (the
Gemma 3 tokenizer is converted from its GGUF once per machine: 86 s on a busy 2-core CPU), and
a race must neither be timed while it runs nor wait for it. In a thread of the app it would do
one or the other (it holds the GIL); in this child process it does neither: the process is
stopped (``SIGSTOP``) while any race is queued or running (``machine.ACTIVE_RACES``) and
continued (``SIGCONT``) when none is, so a Send starts at once and its clocks share the CPU with
nothing of ours. The child runs at the lowest CPU priority, answers one request at a time (a
JSON line in, a JSON line out), and exits after :data:`IDLE_EXIT_S` without a request (the next
request starts another). Where signals cannot stop a process (Windows), it keeps running at
the lowest priority.

    python -m specdemo.services.check_worker   # what the app starts; reads requests on stdin
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading

from ..checks.compat import Verdict
from ..core.machine import ACTIVE_RACES, ActiveRaces
from ..models.loading import ModelLoadError
from .. import PROJECT_DIR
from ..checks import compat

IDLE_EXIT_S = 120.0  # the child exits after this long without a request (its memory returns)
CAN_STOP = hasattr(signal, "SIGSTOP")  # POSIX: a stopped process uses no CPU at all


class CheckWorker:
    """A child process answering ``compat.check_specs(target, draft)``, stopped during races.

    Args:
        races: the race counter whose first race stops the child and whose last one continues
            it (default ``machine.ACTIVE_RACES``).
        command: the child's command line (default this module under this Python).
    """

    def __init__(self, races: ActiveRaces = ACTIVE_RACES, command: list[str] | None = None) -> None:
        self._command = command or [sys.executable, "-m", __name__]
        self._proc: subprocess.Popen | None = None
        self._request = threading.Lock()  # one request at a time
        # the process, whether it is stopped, whether a race runs; never held while calling
        # into ``races`` (whose lock is held while it calls _races_changed)
        self._state = threading.Lock()
        self._stopped = False
        with self._state:
            self._racing = races.on_change(self._races_changed)
        atexit.register(self.close)  # a stopped child would otherwise outlive the app

    def verdict(self, target: str, draft: str) -> Verdict:
        """``compat.check_specs(target, draft)`` computed in the child (waits while a race runs).

        Raises:
            ModelLoadError, ValueError, OSError, RuntimeError: what ``check_specs`` raised there
                (its sentence), or RuntimeError when the child ended without an answer.
        """
        request = json.dumps({"target": target, "draft": draft}) + "\n"
        with self._request:
            for attempt in range(2):  # the child may have just exited idle: start another once
                proc = self._process()
                try:
                    proc.stdin.write(request)
                    proc.stdin.flush()
                    line = proc.stdout.readline()
                except (BrokenPipeError, OSError):
                    line = ""
                if line:
                    return _answer(json.loads(line))
                code = proc.wait()
                if attempt or code != 0:
                    raise RuntimeError(f"the draft check process ended (exit status {code}) "
                                       f"while checking {draft}")
        raise AssertionError("unreachable")

    def close(self) -> None:
        """End the child (continued first, so that it can exit)."""
        with self._state:
            proc, self._proc = self._proc, None
            if proc is not None and proc.poll() is None:
                if self._stopped and CAN_STOP:
                    os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()
            self._stopped = False

    @property
    def stopped(self) -> bool:
        """Whether the child is stopped now (a race is queued or running)."""
        with self._state:
            return self._stopped

    def _process(self) -> subprocess.Popen:
        with self._state:
            if self._proc is None or self._proc.poll() is not None:
                env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                    [_package_root()] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
                # its own process group: should the app end while the child is stopped, the
                # group is orphaned and the kernel hangs it up (SIGHUP, then SIGCONT: POSIX),
                # so a stopped child never outlives the app
                group = {} if not CAN_STOP else {"process_group": 0} \
                    if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
                self._proc = subprocess.Popen(self._command, stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                              text=True, env=env, bufsize=1, **group)
                self._stopped = False
                if self._racing and CAN_STOP:  # started during a race: wait for its end
                    os.kill(self._proc.pid, signal.SIGSTOP)
                    self._stopped = True
                    _wait_stopped(self._proc.pid)
            return self._proc

    def _races_changed(self, running: bool) -> None:
        with self._state:
            self._racing = running
            proc = self._proc
            if not CAN_STOP:
                return
            if proc is None or proc.poll() is not None or running == self._stopped:
                return
            os.kill(proc.pid, signal.SIGSTOP if running else signal.SIGCONT)
            self._stopped = running
            if running:
                _wait_stopped(proc.pid)


STOP_WAIT_S = 1.0  # how long a race's start waits for the kernel to have stopped the child


def _wait_stopped(pid: int) -> None:
    """Return once ``pid`` is stopped (a signal is delivered when the process next runs, so the
    race would otherwise start beside a child still computing), or after :data:`STOP_WAIT_S`."""
    import time

    import psutil
    deadline = time.monotonic() + STOP_WAIT_S
    try:
        process = psutil.Process(pid)
        while process.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE) \
                and time.monotonic() < deadline:
            time.sleep(0.001)
    except psutil.NoSuchProcess:
        pass


def _package_root() -> str:
    return str(PROJECT_DIR)


ERRORS = {"ModelLoadError": ModelLoadError, "ValueError": ValueError, "OSError": OSError}


def _answer(reply: dict) -> Verdict:
    if "error" in reply:
        raise ERRORS.get(reply.get("type"), RuntimeError)(reply["error"])
    return Verdict(reply["status"], list(reply["reasons"]))


def serve(requests, replies, idle_exit_s: float = IDLE_EXIT_S) -> None:
    """The child's loop: one JSON request line in (``target``, ``draft``), one reply line out
    (``status``/``reasons``, or ``error``/``type``); returns at end of input or after
    ``idle_exit_s`` without a request (0: never; not on Windows, whose pipes ``select`` cannot
    wait on)."""
    while True:
        if idle_exit_s and os.name != "nt" and hasattr(requests, "fileno"):
            ready, _, _ = select.select([requests], [], [], idle_exit_s)
            if not ready:
                return
        line = requests.readline()
        if not line:
            return
        ask = json.loads(line)
        try:
            verdict = compat.check_specs(ask["target"], ask["draft"])
            reply = {"status": verdict.status, "reasons": list(verdict.reasons)}
        except Exception as exc:  # every failure is the reply; the loop goes on
            reply = {"error": str(exc), "type": type(exc).__name__}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main() -> None:
    """Run :func:`serve` on stdin/stdout at the lowest CPU priority; anything else the libraries
    print goes to stderr, so stdout carries only replies."""
    try:
        os.nice(19)
    except (AttributeError, OSError):
        pass
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
