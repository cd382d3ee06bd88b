"""``builtin:NAME``, the one place that reads a built-in model's name out of a spec.

A spec (``--target``, ``--draft``, a preset's ``target``/``draft``) names a built-in as
``builtin:NAME``; every layer asks :func:`builtin_name` rather than cutting the text itself.
No torch, no I/O.
"""

from __future__ import annotations

PREFIX = "builtin:"


def builtin_name(spec: str) -> str | None:
    """The NAME of ``builtin:NAME`` (may be empty), or None for a spec of any other form."""
    return spec[len(PREFIX):] if spec.startswith("builtin:") else None


def builtin_spec(name: str) -> str:
    """``builtin:NAME``: the spec that names the built-in ``name``."""
    return PREFIX + name
