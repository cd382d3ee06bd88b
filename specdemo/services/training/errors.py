"""The one error of the training pipeline (:mod:`specdemo.services.training.run`)."""

from __future__ import annotations


class TrainingError(Exception):
    """``train-draft`` refused an input or stopped, in one sentence; the command prints it and
    exits with ``status`` (2: refused, nothing more done; 130: interrupted, the sentence says
    what was saved and how to go on)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status
