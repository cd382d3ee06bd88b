"""Errors shared by the loading modules (``models``, ``builtin``), in a module of their own so
that both can import them."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """A model, tokenizer, device or dtype could not be provided; the message says what to do."""


def reason(exc: BaseException) -> str:
    """The first line of an exception, for one-sentence messages."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
