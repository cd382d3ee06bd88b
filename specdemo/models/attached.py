"""Built once per transformers model: the object a backend keeps on ``loaded.model``."""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def attached(model, attr: str, lock: threading.Lock, build: Callable[[], T],
             refusal: Callable[[], str | None], error: type[Exception]) -> T:
    """The object ``model`` holds under ``attr``; on the first call (under ``lock``) ``build()``
    makes it, unless ``refusal()`` gives a reason.

    Raises:
        error: with ``refusal()``'s reason, when there is one and nothing was built yet.
    """
    with lock:
        obj = getattr(model, attr, None)
        if obj is None:
            reason = refusal()
            if reason:
                raise error(reason)
            obj = build()
            setattr(model, attr, obj)
        return obj
