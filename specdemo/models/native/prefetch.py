"""``native-w8a8``: which register blocks prefetch weights, measured once per machine, library
and model shape (:func:`choose_prefetch`)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import time

from ..builtin import cache_dir, store_cache_entry
from ..hardware import _cpu_name
from ...core import machine
from .build import NativeError, library_path
from .model import NativeKV, NativeModel

log = logging.getLogger(__name__)


PREFETCH_FILE = "native-prefetch.json"  # in models.cache_dir(): the measured choice per machine

PREFETCH_ENV = "SPECDEMO_NATIVE_PREFETCH"  # unset: measured once; "recalibrate"; "all"; "wide"

PREFETCH_ALL = 1  # nf_set_prefetch's narrowest prefetching register block: every block

PREFETCH_WIDTHS = (1, 5)  # a plain step and a verification of 4 drafted tokens (as auto's choice)

PREFETCH_GAIN = 0.03  # prefetching every block must save this share of the time to be chosen


def _prefetch_key(nmodel: NativeModel) -> str:
    parts = [_cpu_name(), library_path().name, nmodel.threads, nmodel.n_layer, nmodel.hidden,
             nmodel.inter, nmodel.vocab, PREFETCH_WIDTHS]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]


def choose_prefetch(nmodel: NativeModel, repeats: int = 12) -> dict:
    """Sets, for the int8-activation kernel (``native-w8a8``), which register blocks prefetch
    their weight stream (``nf_set_prefetch``), from a measurement on this machine, and returns
    ``{"prefetch": "all" | "wide", "reason": str, "cost_s": {...} | None}``.

    ``wide`` (the C default, ``PFQ_MIN``): only blocks of 6+ tokens prefetch; ``all``: every
    block. Which is faster depends on the machine: prefetching at 1-5 tokens measured no gain
    (4-5 tokens: 5% slower) on a 2-core Zen 4 with 40+ GB/s, and 11-25% faster forwards of 1-5
    tokens on a 2-core Xeon with 21 GB/s (``docs/cpu-backends.md``, "Weight prefetch"). The
    measurement alternates both settings forward by forward over :data:`PREFETCH_WIDTHS` tokens
    after 128 cached tokens (``repeats`` each, medians; ~0.5 s for 135M), chooses ``all`` when it
    saves at least :data:`PREFETCH_GAIN`, and is stored per machine, library and model shape in
    ``models.cache_dir()/native-prefetch.json`` unless other processes used more than
    ``machine.BUSY_SHARE`` of the CPU meanwhile. ``SPECDEMO_NATIVE_PREFETCH``: ``all`` or
    ``wide`` chooses without measuring, ``recalibrate`` (or ``SPECDEMO_BACKEND=recalibrate``)
    measures again. The numbers a forward computes do not depend on the setting.

    Raises:
        NativeError: ``SPECDEMO_NATIVE_PREFETCH`` names no setting.
    """
    lib = nmodel.lib
    wide = lib.nf_prefetch_min_default()  # the build's PFQ_MIN, whatever was set since
    asked = os.environ.get(PREFETCH_ENV, "").strip().lower()
    if asked in ("all", "wide"):
        lib.nf_set_prefetch(PREFETCH_ALL if asked == "all" else wide, -1)
        return {"prefetch": asked, "reason": f"{PREFETCH_ENV}={asked}", "cost_s": None}
    if asked not in ("", "recalibrate"):
        raise NativeError(f"{PREFETCH_ENV}={asked} is not a prefetch setting; use all, wide or "
                          "recalibrate")
    path, key = cache_dir() / PREFETCH_FILE, _prefetch_key(nmodel)
    # SPECDEMO_BACKEND (services.backend_store.CHOICE_ENV: a layer above this one)
    again = "recalibrate" in (asked, os.environ.get("SPECDEMO_BACKEND", "").strip().lower())
    if not again:
        try:
            entry = json.loads(path.read_text())[key]
            lib.nf_set_prefetch(PREFETCH_ALL if entry["prefetch"] == "all" else wide, -1)
            return {**entry, "reason": "measured earlier on this machine: " + entry["reason"]}
        except (OSError, ValueError, KeyError, TypeError):
            pass
    kv = NativeKV(nmodel)
    context = [i % (nmodel.vocab - 1) + 1 for i in range(128)]
    kv.forward(context)
    settings = {"wide": wide, "all": PREFETCH_ALL}
    times = {(name, n): [] for name in settings for n in PREFETCH_WIDTHS}
    others = machine.OtherCpuUse()
    for _ in range(repeats):
        for n in PREFETCH_WIDTHS:
            for name, narrowest in settings.items():
                lib.nf_set_prefetch(narrowest, -1)
                start = time.perf_counter()
                kv.forward([1] * n, logits_to_keep=1)
                times[(name, n)].append(time.perf_counter() - start)
                kv.rollback(len(context))
    share = others.share()
    cost = {name: sum(statistics.median(times[(name, n)]) for n in PREFETCH_WIDTHS)
            for name in settings}
    best = "all" if cost["all"] < (1 - PREFETCH_GAIN) * cost["wide"] else "wide"
    lib.nf_set_prefetch(settings[best], -1)
    reason = (f"prefetch {best}: every block {cost['all'] * 1e3:.2f} ms, blocks of {wide}+ tokens "
              f"{cost['wide'] * 1e3:.2f} ms for a 1-token plus a 5-token forward")
    entry = {"prefetch": best, "reason": reason, "cost_s": cost}
    if share is not None and share > machine.BUSY_SHARE:
        return {**entry, "reason": reason + f"; machine busy (others used {share:.0%} of the CPU), "
                "so not stored"}
    try:
        store_cache_entry(path, key, {**entry, "measured_unix_s": time.time()})
    except OSError as exc:
        log.warning("native prefetch choice not stored in %s (%s)", path, exc)
    return entry
