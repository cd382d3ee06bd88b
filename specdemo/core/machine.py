"""How busy the machine was while something was timed: other processes' share of the CPU.

A decode or a kernel calibration timed while another process uses the CPU is slower than this
machine is, and nothing in its own numbers says so (a plain run at 4 tokens/s instead of 20 made
a race report 3.2x). :class:`OtherCpuUse` measures, over an interval, the CPU time every other
process took as a share of all cores' time; the race, ``compare``, the benchmark and the fast
path's calibration read it, and :func:`busy_warning` says when a result should not be trusted.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Callable, Iterator

BUSY_SHARE = 0.25  # other processes above this share of all cores' time: a timing is not reliable
MIN_MEASURED_S = 0.5  # shorter intervals: the kernel's CPU-time ticks (10 ms) make the share noise


class OtherCpuUse:
    """CPU time other processes take from now on, as a share of all cores' time.

    System-wide busy seconds (user, nice, system, irq, softirq of every core, from psutil)
    minus this process's own (all its threads), over wall seconds x logical cores.

    Args:
        psutil_module: the ``psutil`` module (injectable for tests; imported when None).
        clock: wall clock in seconds (injectable for tests).
    """

    def __init__(self, psutil_module=None, clock: Callable[[], float] = time.perf_counter) -> None:
        if psutil_module is None:
            import psutil as psutil_module
        self._psutil = psutil_module
        self._clock = clock
        self._start = (self._busy_s(), self._own_s(), clock())

    def _busy_s(self) -> float:
        t = self._psutil.cpu_times()
        return sum(getattr(t, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq"))

    def _own_s(self) -> float:
        t = self._psutil.Process().cpu_times()
        return t.user + t.system

    def elapsed_s(self) -> float:
        """Wall seconds since this measurement started."""
        return self._clock() - self._start[2]

    def share(self) -> float:
        """Other processes' CPU seconds / (wall seconds x logical cores) since the start, in
        0..1 (0.5 on 2 cores: one core's worth of other work); 0.0 before any time passed."""
        busy0, own0, wall0 = self._start
        wall = (self._clock() - wall0) * (self._psutil.cpu_count(logical=True) or 1)
        others = (self._busy_s() - busy0) - (self._own_s() - own0)
        return max(0.0, min(1.0, others / wall)) if wall > 0 else 0.0

    def share_if_measurable(self, min_s: float | None = None) -> float | None:
        """:meth:`share`, or None when fewer than ``min_s`` wall seconds passed (default
        :data:`MIN_MEASURED_S`): over a few ticks of CPU-time accounting the share is noise."""
        min_s = MIN_MEASURED_S if min_s is None else min_s
        return self.share() if self.elapsed_s() >= min_s else None


def is_busy(share: float | None) -> bool:
    """True when ``share`` (other processes' share of the CPU, 0..1) is above :data:`BUSY_SHARE`."""
    return share is not None and share > BUSY_SHARE


def busy_warning(shares: dict[str, float | None], result: str = "the speedup") -> str | None:
    """One sentence when other processes used more than :data:`BUSY_SHARE` of the CPU during any
    of the named runs, else None.

    Args:
        shares: {run name (``plain``, ``speculative``): other processes' share of the CPU during
            that run, 0..1, or None when not measured}.
        result: what the busy machine makes unreliable.
    Returns:
        e.g. ``"machine busy: other processes used 43% of the CPU during the plain run; the
        speedup is not reliable"``.
    """
    busy = [(name, share) for name, share in shares.items() if is_busy(share)]
    if not busy:
        return None
    parts = [f"{share:.0%} of the CPU during the {name} run" if i == 0
             else f"{share:.0%} during the {name} run" for i, (name, share) in enumerate(busy)]
    return (f"machine busy: other processes used {' and '.join(parts)}; {result} is not "
            "reliable")


class ActiveRaces:
    """How many races are queued or running in this process, so that background work of the
    app (the draft list's compatibility checks) can wait until none is: work done meanwhile
    would be timed as part of a race."""

    def __init__(self) -> None:
        self._count = 0
        self._background = 0
        self._idle = threading.Condition()
        self._listeners: list = []

    def on_change(self, listener) -> bool:
        """Call ``listener(True)`` when the first race is queued and ``listener(False)`` when
        the last one ends (under this object's lock, in order: the listener must not call back
        into this object); returns whether a race is queued or running now."""
        with self._idle:
            self._listeners.append(listener)
            return self._count > 0

    def begin(self) -> None:
        with self._idle:
            self._count += 1
            if self._count == 1:
                self._tell(True)

    def end(self) -> None:
        with self._idle:
            self._count = max(0, self._count - 1)
            if self._count == 0:
                self._idle.notify_all()
                self._tell(False)

    def _tell(self, running: bool) -> None:
        for listener in self._listeners:
            listener(running)

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block until no race is queued or running (True), or ``timeout_s`` passed (False)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._count == 0, timeout_s)

    @contextlib.contextmanager
    def background(self, timeout_s: float | None = 600) -> Iterator[None]:
        """Run the block as background work: it starts once no race is queued or running (or
        after ``timeout_s``), and a race that begins meanwhile waits for it to end
        (:meth:`wait_background`) before timing anything, so it never lands in one lane."""
        with self._idle:
            self._idle.wait_for(lambda: self._count == 0, timeout_s)
            self._background += 1
        try:
            yield
        finally:
            with self._idle:
                self._background -= 1
                self._idle.notify_all()

    def background_running(self) -> bool:
        """True while background work (:meth:`background`) runs."""
        with self._idle:
            return self._background > 0

    def wait_background(self, timeout_s: float | None = None) -> bool:
        """Block until no background work runs (True), or ``timeout_s`` passed (False)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._background == 0, timeout_s)


ACTIVE_RACES = ActiveRaces()


def default_threads() -> int:
    """Threads for our C forward and llama.cpp: the cores this process may use (what
    ``llama-bench -t`` would be given on this machine), at most 8."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(8, n))


def cpu_flags() -> str:
    """The CPU's feature flags as /proc/cpuinfo lists them ("flags" on x86, "Features" on Arm),
    space-separated; elsewhere (macOS, Windows) ``platform.machine()``."""
    import platform
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()
