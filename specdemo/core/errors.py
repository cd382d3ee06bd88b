"""Errors shared by the loading modules (``models``, ``builtin``) and the drafter families, in a
module of their own so that all of them can import them (it imports nothing)."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """A model, tokenizer, device or dtype could not be provided; the message says what to do."""


class DrafterRefused(ModelLoadError):
    """A learned drafter that cannot serve this target; ``problems`` has one sentence each."""

    def __init__(self, spec: str, target: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"draft {spec} cannot serve target {target}: " + "; ".join(problems))


def reason(exc: BaseException) -> str:
    """The first line of an exception, for one-sentence messages."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
