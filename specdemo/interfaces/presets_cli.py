"""``presets`` subcommand: list the presets and mark which fit this machine (reading and
checking the preset files: ``services/presets.py``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..models import hardware
from ..models.hardware import format_bytes
from ..services import presets as service


#: the listing's one-line key to its marks and its two groups
LEGEND = ("legend: * recommended; fits / no: fits this machine's memory or not (why: the line "
          "under); 'usable now': its models are on this machine (built-in or downloaded), no "
          "network needed; 'hub': it downloads its models from the model hub on first use")
HERE_TITLE = "usable now ({n}):"
HUB_TITLE = "hub: downloads on first use ({n}):"
HUB_OFFLINE_TITLE = "hub: not usable now, {offline} ({n}):"


def _print_preset(preset, verdict: tuple[bool, str], picked) -> None:
    """Two or three lines: the marks, name, memory, target + draft and flags; why it fits or
    not; and the preset's note, when it has one (what to expect of it, as the page shows)."""
    ok, reason = verdict
    marks = ("*" if picked and picked.name == preset.name else " ") + ("fits" if ok else "no  ")
    flags = (" [default]" if preset.default else "") + (" [gated]" if preset.gated else "")
    print(f"{marks} {preset.name:26s} {format_bytes(preset.memory_bytes):>8s}  "
          f"{preset.target} + {preset.draft}{flags}")
    print(f"       {reason}")
    if preset.note:
        print(f"       note: {preset.note}")


def _verdict(preset, hw, presets, usable, offline: str | None) -> tuple[bool, str]:
    """``hardware.fits`` of ``preset``, whose "would fit" suggests only presets usable now when
    the hub is not (``offline``: why): a new user offline was offered hub presets that could
    not run either."""
    if not offline:
        return hardware.fits(preset, hw, alternatives=presets)
    ok, reason = hardware.fits(preset, hw, alternatives=usable)
    return ok, reason if ok else reason + " (among the presets usable now: the hub is not)"


def register(sub) -> None:
    """Add ``presets``: list presets and mark which fit this machine."""
    parser = sub.add_parser("presets", help="list presets and which fit this machine")
    parser.add_argument("--dir", type=Path, default=None, help="presets directory (default: presets/)")
    parser.add_argument("--all-gated", action="store_true",
                        help="let the recommendation pick gated models (hub licence accepted)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=cmd_presets)


def cmd_presets(args: argparse.Namespace) -> int:
    try:
        presets = service.list_presets(args.dir)
    except service.PresetError as exc:
        print(f"error: {exc}")
        return 1
    hw = hardware.detect()
    to_fetch = {p.name: service.hub_models_to_fetch(p) for p in presets}
    offline = service.hub_unavailable() if any(to_fetch.values()) else None
    usable = [p for p in presets if not (offline and to_fetch[p.name])]
    verdicts = {p.name: _verdict(p, hw, presets, usable, offline) for p in presets}
    pick = hardware.recommend(usable, hw, allow_gated=args.all_gated)
    if offline:
        left_out = [p.name for p in presets if to_fetch[p.name]]
        pick.reasons.insert(0, f"{offline}: recommended among the presets whose models are on "
                               f"this machine already; left out ({len(left_out)}, they download "
                               f"models on first use): {', '.join(left_out)}")
    if args.json:
        print(json.dumps({
            "hardware": hw.to_dict(),
            "recommended": pick.preset.name if pick.preset else None,
            "reasons": pick.reasons,
            "hub_unavailable": offline,
            "presets": [dict(p.to_dict(), fits=verdicts[p.name][0], reason=verdicts[p.name][1],
                             to_download=to_fetch[p.name],
                             usable_now=not (offline and to_fetch[p.name])) for p in presets],
        }, indent=2))
        return 0
    print(f"this machine: {hardware.describe(hw)}")
    print(LEGEND)
    here = [p for p in presets if not to_fetch[p.name]]
    hub = [p for p in presets if to_fetch[p.name]]
    for title, group in ((HERE_TITLE, here), (HUB_OFFLINE_TITLE if offline else HUB_TITLE, hub)):
        if group:
            print(title.format(n=len(group), offline=offline))
        for preset in group:
            _print_preset(preset, verdicts[preset.name], pick.preset)
    print("recommended: " + (pick.preset.name if pick.preset else "none"))
    for reason in pick.reasons:
        print(f"  - {reason}")
    return 0
