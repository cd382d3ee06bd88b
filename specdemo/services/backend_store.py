"""The stored backend choices: what ``auto`` measured, kept per machine and target in
``models.cache_dir()/backend-choice.json``, read back only after it is checked, and dropped when
a later run measures the chosen backend's step far from what was stored.

What is read is validated (:func:`entry_problem`): its shape (a JSON object whose fields have the
types :func:`services.backend_choice.choose_backend` writes, numbers finite and in range), its
names (the backend chosen and every timed one among this key's candidates) and its machine (the
fingerprint of the CPU that measured it, :func:`machine_fingerprint`). An entry that fails is
ignored, measured again, and the start-up says what was ignored and why.

Re-weighing (:func:`recheck`): a choice made in the first minute after set-up, while the machine
was not yet quiet, was once stored with both leaders within 4% and kept for good, although quiet
the other ran 18% faster. So when a run measures the chosen backend's one-token forward (the
forward-cost table of draft length ``auto``, on a quiet machine) at more than
:data:`WIDE_MARGIN` times or under 1 / :data:`WIDE_MARGIN` of the stored estimate, the entry is
dropped and the next start weighs the backends again. What is left under its key says why
(``dropped_because``), and that start's step says it (:func:`miss_reason`, which otherwise
names what differs from the nearest entry stored for the target: each entry keeps its key's
named parts).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from pathlib import Path

from ..core import machine
from ..models import builtin
from ..models.hardware import _cpu_name

log = logging.getLogger(__name__)

CHOICE_FILE = "backend-choice.json"  # in models.cache_dir(): measured costs by machine and target
CHOICE_ENV = "SPECDEMO_BACKEND"  # "recalibrate" measures again; nothing else is meant by it
RECALIBRATE = f"{CHOICE_ENV}=recalibrate measures again"
#: a run's one-token forward this many times the stored estimate (or under its inverse): re-weigh
WIDE_MARGIN = 1.5


def choice_path() -> Path:
    return builtin.cache_dir() / CHOICE_FILE


def machine_fingerprint() -> str:
    """What identifies this machine's CPU for a stored timing: its model name, its flags and its
    logical core count, hashed (a cache folder copied to another machine is not trusted)."""
    parts = [_cpu_name(), machine.cpu_flags(), os.cpu_count()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def env_request() -> tuple[bool, str | None]:
    """(whether ``SPECDEMO_BACKEND`` asks to measure again, a warning when it holds anything
    else: it is not a way to choose a backend, which ``--backend`` is)."""
    value = os.environ.get(CHOICE_ENV, "").strip()
    if value.lower() in ("", "recalibrate"):
        return value.lower() == "recalibrate", None
    return False, (f"{CHOICE_ENV}={value} ignored: it takes only 'recalibrate' (measure the "
                   "backend choice again); choose a backend with --backend NAME")


def _number(value, low: float = 0.0, high: float = math.inf) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and low <= value <= high)


def _names_map(value, names: tuple[str, ...], check) -> str | None:
    """Why ``value`` is not a {candidate name: v} map with ``check(v)`` true (None: it is)."""
    if not isinstance(value, dict):
        return "is not a map"
    for name, v in value.items():
        if name not in names:
            return f"names {name!r}, not a candidate here"
        if not check(v):
            return f"holds {v!r} for {name}"
    return None


def entry_problem(entry, names: tuple[str, ...], fingerprint: str | None = None) -> str | None:
    """Why a stored entry cannot be trusted for a choice among ``names`` on this machine, in one
    clause; None when it can."""
    if not isinstance(entry, dict):
        return f"it is {type(entry).__name__}, not an object"
    backend = entry.get("backend")
    if not isinstance(backend, str) or backend not in names:
        return (f"its backend {backend!r} is not one of this target's candidates here "
                f"({', '.join(names)})")
    if entry.get("machine") != (fingerprint or machine_fingerprint()):
        return "it was measured on another machine (or does not say which)"
    if not isinstance(entry.get("reason"), str):
        return "its reason is not text"
    checks = {
        "cost_s": _number,
        "forward_s": lambda w: isinstance(w, dict) and bool(w) and all(
            str(n).isdigit() and _number(t) for n, t in w.items()),
        "probe_s": _number,
        "dropped": lambda why: isinstance(why, str),
        "draft_length": lambda k: isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= 64,
        "acceptance": lambda a: a is None or _number(a, 0.0, 1.0),
    }
    for field_name, check in checks.items():
        problem = _names_map(entry.get(field_name, {}), names, check)
        if problem:
            return f"its {field_name} {problem}"
    if backend not in entry.get("cost_s", {}) or backend not in entry.get("forward_s", {}):
        return f"it holds no timing of {backend}"
    share = entry.get("other_cpu_share")
    if share is not None and not _number(share, 0.0, 1.0):
        return f"its other_cpu_share {share!r} is not a share from 0 to 1"
    return None


def read(key: str, names: tuple[str, ...]) -> tuple[dict | None, str | None]:
    """(the entry stored under ``key``, checked for a choice among ``names``; None when there is
    none or it cannot be trusted, a sentence saying what was ignored and why, or None)."""
    path = choice_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"the stored backend choices in {path} were ignored (unreadable: {exc})"
    if not isinstance(data, dict):
        return None, f"the stored backend choices in {path} were ignored (not a JSON object)"
    if key not in data or _is_dropped(data[key]):
        return None, None
    problem = entry_problem(data[key], names)
    if problem:
        return None, (f"the stored backend choice for this target was ignored: {problem}; "
                      "measured again")
    return data[key], None


def write(key: str, entry: dict) -> None:
    """Store ``entry`` under ``key``, with this machine's fingerprint (logged when it cannot be
    written: the store is optional)."""
    try:
        builtin.store_cache_entry(choice_path(), key, {**entry, "machine": machine_fingerprint()})
    except OSError as exc:
        log.warning("backend choice not stored in %s (%s)", choice_path(), exc)


def _is_dropped(entry) -> bool:
    """Whether ``entry`` is what :func:`forget` leaves: no choice, only why it was dropped."""
    return isinstance(entry, dict) and isinstance(entry.get(DROPPED), str)


DROPPED = "dropped_because"  # the field of a dropped entry: the sentence the next start says


def forget(key: str, because: str | None = None) -> bool:
    """Drop the choice under ``key`` (True when there was one and it is gone). With
    ``because``, what is left under ``key`` says so (its ``dropped_because``, with this
    machine's fingerprint and the key's named parts), and the next start that measures again
    says it (:func:`miss_reason`)."""
    path = choice_path()
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or _is_dropped(data.get(key)):
            return False
        old = data.pop(key, None)
        if old is None:
            return False
        if because:
            data[key] = {DROPPED: because, "machine": machine_fingerprint(),
                         "key_parts": old.get("key_parts") if isinstance(old, dict) else None}
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
        return True
    except (OSError, ValueError) as exc:
        log.warning("stored backend choice not dropped from %s (%s)", path, exc)
        return False


def _shown(value) -> str:
    if isinstance(value, list):
        return "/".join(str(v) for v in value) or "none"
    return str(value)


def miss_reason(key: str, parts: dict) -> str:
    """Why no stored choice serves ``key`` (whose named parts are ``parts``: target, torch,
    threads, candidates, drafter, OpenMP waiting, ...), in one clause for the start-up step:
    ``"measured again: "`` and what a recheck said when it dropped it, or how the entry stored
    for this target on this machine that differs in the fewest parts differs (``"measured
    again: the stored choice was for OpenMP waiting OMP_WAIT_POLICY=active, now automatic"``);
    ``"first choice here: ..."`` when none is stored for this target yet."""
    try:
        data = json.loads(choice_path().read_text())
    except (OSError, ValueError):
        data = {}
    data = data if isinstance(data, dict) else {}
    here = machine_fingerprint()
    if _is_dropped(data.get(key)):
        return f"measured again: the stored choice was dropped: {data[key][DROPPED]}"
    nearest, unnamed = None, False
    for entry in data.values():
        if not (isinstance(entry, dict) and entry.get("machine") == here
                and not _is_dropped(entry)):
            continue
        if not isinstance(entry.get("key_parts"), dict):
            unnamed = True  # stored by an earlier specdemo, keyed otherwise
            continue
        theirs = entry["key_parts"]
        if theirs.get("target") != parts.get("target"):
            continue
        differ = [name for name in parts if json.dumps(theirs.get(name), default=str)
                  != json.dumps(parts[name], default=str)]
        if differ and (nearest is None or len(differ) < len(nearest[0])):
            nearest = (differ, theirs)
    if nearest is None:
        return (f"first choice here: none stored for {parts.get('target', 'this target')} and "
                "this race on this machine yet" + (" (choices stored by an earlier specdemo "
                                                   "are keyed otherwise)" if unnamed else ""))
    differ, theirs = nearest
    # a part not read now (the GGUF's size when ggml is no candidate) follows from another
    # that differs: name only what this start read
    differ = [name for name in differ if parts[name] is not None] or differ
    return "measured again: the stored choice was for " + ", ".join(
        f"{name} {_shown(theirs.get(name))}, now {_shown(parts[name])}" for name in differ)


def wide_miss(estimate_s: float, measured_s: float, margin: float = WIDE_MARGIN) -> bool:
    """Whether ``measured_s`` lies outside [estimate / margin, estimate * margin]."""
    return estimate_s > 0 and measured_s > 0 and not (
        estimate_s / margin <= measured_s <= estimate_s * margin)


def recheck_against_others(choice, plain_tokens_per_s: dict[str, float | None],
                           other_cpu_share: float | None) -> str | None:
    """After ``costs`` measured every candidate: when another backend's plain tokens/s beats the
    stored choice's by a wide margin (:func:`wide_miss`) on a quiet machine, drop the stored
    entry so that the next start weighs the backends again (a choice made under a transient is
    not kept for good).

    Args:
        choice: the ``backend_choice.BackendChoice`` in use (its ``key``: the stored entry).
        plain_tokens_per_s: {backend: plain decoding tokens/s measured now}.
        other_cpu_share: other processes' share of the CPU while it measured (None: unknown).
    Returns:
        The sentence saying so, or None.
    """
    if choice is None or choice.key is None or machine.is_busy(other_cpu_share):
        return None
    ours = plain_tokens_per_s.get(choice.backend)
    rates = {b: r for b, r in plain_tokens_per_s.items() if r and b != choice.backend}
    if not ours or not rates:
        return None
    best = max(rates, key=rates.get)
    if rates[best] <= ours * WIDE_MARGIN or not forget(
            choice.key, f"costs measured {best} at {rates[best]:.1f} plain tokens/s, "
            f"{rates[best] / ours:.2f}x the stored choice {choice.backend} ({ours:.1f})"):
        return None
    choice.key = None
    return (f"the stored backend choice is {choice.backend} ({ours:.1f} plain tokens/s now), but "
            f"{best} measured {rates[best]:.1f} ({rates[best] / ours:.2f}x): the backends are "
            "weighed again at the next start")


def recheck(loaded, forward_s: dict[int, float], other_cpu_share: float | None) -> str | None:
    """Compare a run's measured one-token forward on ``loaded``'s backend with the estimate of
    the choice that put it there (``loaded.backend_choice``, set by ``backend_choice.use_backend``);
    on a wide miss (:func:`wide_miss`) measured on a quiet machine, drop the stored entry so that
    the next start weighs the backends again.

    Args:
        loaded: the target on its backend.
        forward_s: {width: seconds of one forward} this run measured (width 1 is compared).
        other_cpu_share: other processes' share of the CPU while it measured (None: unknown);
            above ``machine.BUSY_SHARE`` nothing is concluded.
    Returns:
        The sentence saying so, or None (nothing to compare, close enough, or a busy run).
    """
    choice = getattr(loaded, "backend_choice", None)
    if choice is None or choice.key is None or 1 not in forward_s:
        return None
    estimate = (choice.forward_s.get(choice.backend) or {}).get(1)
    if estimate is None or not wide_miss(estimate, forward_s[1]):
        return None
    if other_cpu_share is not None and other_cpu_share > machine.BUSY_SHARE:
        return None
    if not forget(choice.key, f"a run measured a one-token forward of "
                  f"{forward_s[1] * 1000:.1f} ms on {choice.backend}, "
                  f"{forward_s[1] / estimate:.2f}x the {estimate * 1000:.1f} ms it expected"):
        return None
    choice.key = None  # once per choice
    return (f"the stored backend choice expected a one-token forward of "
            f"{estimate * 1000:.1f} ms on {choice.backend}, this run measured "
            f"{forward_s[1] * 1000:.1f} ms ({forward_s[1] / estimate:.2f}x): the backends are "
            "weighed again at the next start")
