"""Example prompts by task, stored as data under ``assets/prompts/<task>.json`` (lists of strings).

Tasks span the entropy range speculation depends on: code, maths and grounded (answers that copy
from the prompt) are low-entropy; chat and creative writing are high-entropy.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import PROJECT_DIR

PROMPT_DIR = PROJECT_DIR / "assets" / "prompts"
TASKS = ("code", "maths", "grounded", "chat", "creative")


def load_prompts(tasks: tuple[str, ...] | list[str] = TASKS, directory: Path = PROMPT_DIR) -> dict[str, list[str]]:
    """{task: [prompt, ...]} for the requested tasks, in the given order.

    Raises:
        ValueError: for an unknown task, naming the known ones.
        FileNotFoundError: when a task's file is missing.
    """
    out = {}
    for task in tasks:
        path = directory / f"{task}.json"
        if task not in TASKS and not path.exists():
            raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(TASKS)}")
        prompts = json.loads(path.read_text(encoding="utf-8"))
        if not (isinstance(prompts, list) and prompts and all(isinstance(p, str) and p.strip() for p in prompts)):
            raise ValueError(f"{path}: expected a non-empty list of non-empty strings")
        out[task] = prompts
    return out
