"""How OpenMP threads wait: chosen once, before torch (or llama.cpp) loads its OpenMP runtime.

Both torch and llama.cpp's CPU library (``libgomp.so.1``) run their threads as an OpenMP team,
and the runtime reads ``OMP_WAIT_POLICY`` once, when it loads. The two choices cost in opposite
situations (2-core AMD EPYC, built-in SmolLM2-135M, ``costs --backend auto``; docs/performance-cpu.md):

- threads that *spin* a while at a barrier (libgomp's default) lose 2-5x as soon as another
  process wants the same cores: the team waits on a thread that is not running;
- threads that *sleep* at once (``PASSIVE``) pay a kernel wake-up at every barrier, and llama.cpp
  has one after every operator: on a quiet machine its decoding ran 2.5-3.3x slower (25-37
  against 80-94 tokens/s), torch's 1.3x.

So the choice is measured: the runnable tasks of other processes (``procs_running`` in
``/proc/stat``, a few samples over ~20 ms) against the cores left beside our own threads.
Spinning stays (libgomp's default) when our threads fit beside them, else ``PASSIVE``.
A value the user set (``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``) always wins; where
``/proc/stat`` cannot be read (macOS, Windows) threads wait passively, as before this measurement.
The llama-server processes that specdemo starts get :func:`child_env`:
the environment without the setting made here, so they wait as they do when a user runs them
(a choice made while other processes started at the same moment would otherwise stay with a
server for its whole life).

Only the standard library: this runs when ``specdemo`` is imported.
"""

from __future__ import annotations

import os
import time

#: samples of /proc/stat's procs_running, and the seconds between them
SAMPLES, INTERVAL_S = 5, 0.004

#: what :func:`apply` decided in this process (``specdemo.OMP_WAIT`` is the same dict)
DECISION: dict | None = None


def usable_cores() -> int:
    """Logical cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def others_running(stat_path: str = "/proc/stat", samples: int = SAMPLES,
                   interval_s: float = INTERVAL_S) -> int | None:
    """Runnable tasks of other processes right now: the fewest over ``samples`` reads of
    ``procs_running`` (which counts this process's running thread too, so one is taken off).

    Returns None when the file cannot be read or has no such line (not Linux)."""
    counts = []
    for i in range(samples):
        try:
            with open(stat_path, encoding="ascii") as f:
                line = next((ln for ln in f if ln.startswith("procs_running")), None)
        except OSError:
            return None
        if line is None:
            return None
        counts.append(int(line.split()[1]))
        if i + 1 < samples:
            time.sleep(interval_s)
    # the fewest: a task that stays runnable is in every sample; one starting up or waking briefly is not
    return max(0, min(counts) - 1)


def choose(others: int | None, cores: int) -> str:
    """``"spin"`` (libgomp's default waiting) when our threads fit beside the other runnable
    tasks, else ``"passive"``; ``"passive"`` when ``others`` is unknown.

    Our threads: as many as the cores (torch's default on a small machine), at most 8 (llama.cpp's
    here); they fit when ``others + threads <= cores``."""
    if others is None:
        return "passive"
    threads = min(8, cores)
    return "spin" if others + threads <= cores else "passive"


def apply(environ=os.environ, stat_path: str = "/proc/stat") -> dict:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` in ``environ`` when :func:`choose` says so and the user
    set neither variable. Returns what was decided, for reports:
    ``{"policy": "spin" | "passive" | "user", "others_running": int | None, "cores": int,
    "setting": the variables in effect}``."""
    global DECISION
    cores = usable_cores()
    user = {k: environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in environ}
    if user:
        decision = {"policy": "user", "others_running": None, "cores": cores, "setting": user}
    else:
        others = others_running(stat_path)
        policy = choose(others, cores)
        if policy == "passive":
            environ["OMP_WAIT_POLICY"] = "PASSIVE"
        decision = {"policy": policy, "others_running": others, "cores": cores,
                    "setting": {"OMP_WAIT_POLICY": "PASSIVE"} if policy == "passive" else {}}
    if environ is os.environ:  # this process's own decision (tests pass their own dicts)
        DECISION = decision
    return decision


def child_env(decision: dict | None = None, environ=os.environ) -> dict:
    """The environment for a llama.cpp program specdemo starts: ``environ`` without the
    ``OMP_WAIT_POLICY`` that :func:`apply` set (a value the user set stays)."""
    decision = DECISION if decision is None else decision
    env = dict(environ)
    if decision is not None and decision["policy"] == "passive" and env.get("OMP_WAIT_POLICY") == "PASSIVE":
        env.pop("OMP_WAIT_POLICY")
    return env


def describe(decision: dict) -> str:
    """One line for a report: how OpenMP threads wait in this process, and why."""
    if decision["policy"] == "user":
        return "OpenMP waiting as you set it (" + ", ".join(
            f"{k}={v}" for k, v in decision["setting"].items()) + ")"
    why = ("other runnable tasks unknown" if decision["others_running"] is None else
           f"{decision['others_running']} other runnable task(s) at start, {decision['cores']} cores")
    return ("OpenMP threads spin while they wait" if decision["policy"] == "spin" else
            "OpenMP threads wait passively (OMP_WAIT_POLICY=PASSIVE)") + f" ({why})"
