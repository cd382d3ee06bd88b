"""What a benchmark sweeps (:class:`BenchConfig` and its parsers) and what one decode records
(:class:`Run`, with its peak memory from :class:`PeakMemory`), shared by both engines."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable, Iterator

from ..prompts import TASKS
from ...core.stats import count_positions
from ...core.tree import TreeShape
from ...models.hardware import memory_in_use_bytes

ENGINES = ("specdemo", "transformers")
DIGITS = 4  # decimals kept for every float written out
DEFAULT_DRAFT_LENGTHS: tuple[int | str, ...] = (1, 2, 4, 8, "auto")


@dataclass(frozen=True)
class BenchConfig:
    """What to sweep.

    Attributes:
        tasks: prompt sets under ``assets/prompts`` (or keys of the prompts given to the sweep).
        draft_lengths: fixed k values and/or "auto".
        max_new_tokens: per decode.
        repeats: times every decode runs; cells report median, min and max over repeats.
        temperature: 0 = greedy (outputs are then checked against plain decoding).
        seed: sampling seed (temperature > 0).
        prompts_per_task: use only the first N prompts of each task (None = all).
        concurrency: request counts for the concurrency sweep (empty = skip it).
        reference: also run transformers' generate() on the same model object.
        system: optional system prompt.
        tree: a draft tree shape for the learned drafter's rounds (``core.tree``), or None.
    """

    tasks: tuple[str, ...] = TASKS
    draft_lengths: tuple[int | str, ...] = DEFAULT_DRAFT_LENGTHS
    max_new_tokens: int = 128
    repeats: int = 1
    temperature: float = 0.0
    seed: int | None = None
    prompts_per_task: int | None = None
    concurrency: tuple[int, ...] = ()
    reference: bool = True
    system: str | None = None
    tree: TreeShape | None = None

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("no tasks to benchmark: give at least one, e.g. --tasks code")
        if not self.draft_lengths:
            raise ValueError("no draft lengths: give at least one, e.g. --draft-lengths 4")
        for k in self.draft_lengths:
            if not (k == "auto" or (isinstance(k, int) and 1 <= k <= 64)):
                raise ValueError(f"draft length must be 1..64 or 'auto', got {k!r}")
        if self.max_new_tokens < 1 or self.repeats < 1:
            raise ValueError("max_new_tokens and repeats must be at least 1")
        if self.prompts_per_task is not None and self.prompts_per_task < 1:
            raise ValueError("prompts_per_task must be at least 1")
        if any(n < 1 for n in self.concurrency):
            raise ValueError(f"concurrency levels must be >= 1, got {self.concurrency}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def engines(self) -> tuple[str, ...]:
        return ENGINES if self.reference else ENGINES[:1]

    def settings(self, draft_length: int | str = 4):
        from ..pipeline import DecodeSettings  # lazy: imports torch; --help stays fast
        return DecodeSettings(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                              seed=self.seed, draft_length=draft_length, tree=self.tree)


def parse_draft_lengths(text: str) -> tuple[int | str, ...]:
    """``"1,2,4,auto"`` -> ``(1, 2, 4, "auto")``.

    Raises:
        ValueError: for anything that is not an integer 1..64 or "auto".
    """
    out: list[int | str] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        if item == "auto":
            out.append(item)
        elif item.isdigit() and 1 <= int(item) <= 64:
            out.append(int(item))
        else:
            raise ValueError(f"draft length must be 1..64 or 'auto', got {item!r}")
    return tuple(dict.fromkeys(out))


def parse_ints(text: str) -> tuple[int, ...]:
    """``"1,2,4,8"`` -> ``(1, 2, 4, 8)``; raises ValueError on a non-integer."""
    try:
        return tuple(dict.fromkeys(int(s) for s in text.split(",") if s.strip()))
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None


def parse_tasks(text: str | Iterable[str]) -> tuple[str, ...]:
    items = text.split(",") if isinstance(text, str) else list(text)
    return tuple(dict.fromkeys(t.strip() for t in items if t.strip()))


# ----------------------------------------------------------------------------- one decode

@dataclass
class Run:
    """One timed decode.

    Attributes:
        draft_length: None for plain decoding.
        rounds: verification forwards (ours: target forwards after prefill; transformers: rounds
            of its assisted loop, the first of which is also the prefill).
        round_tokens: new tokens those rounds produced (ours: all but the prefill's token).
        peak_memory_bytes: CUDA: peak bytes allocated by torch during the decode; CPU/MPS: the
            highest memory in use (process RSS / MPS allocation) seen at any streamed token.
        peak_memory_method: how ``peak_memory_bytes`` was measured (:data:`PEAK_METHODS`), since
            the three are not alike: a CUDA peak catches every transient tensor, a sampled one
            only what is held when a token streams, and RSS counts the whole process.
        identical: output equals the same engine's plain output (None when sampling).
        same_as_specdemo_plain: output equals our plain output (greedy only).
    """

    engine: str
    task: str
    prompt: int
    repeat: int
    draft_length: int | str | None
    new_tokens: int
    elapsed_s: float
    ttft_s: float | None
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    round_tokens: int = 0
    position_drafted: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    draft_s: float | None = None
    verify_s: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_method: str | None = None
    extra_memory_bytes: int | None = None
    finish_reason: str | None = None
    identical: bool | None = None
    same_as_specdemo_plain: bool | None = None
    token_ids: list[int] = field(default_factory=list, repr=False)

    def record_round(self, n_drafted: int, n_accepted: int, n_tokens: int) -> None:
        """One verification round (same per-position rule as ``DecodeStats.record_round``)."""
        self.rounds += 1
        self.round_tokens += n_tokens
        self.drafted += n_drafted
        self.accepted += n_accepted
        count_positions(self.position_drafted, self.position_accepted, n_drafted, n_accepted)

    def as_dict(self) -> dict:
        out = asdict(self)
        out.pop("token_ids")
        return out


#: device type -> how :class:`PeakMemory` measures there (``Run.peak_memory_method``)
PEAK_METHODS = {"cuda": "torch.cuda.max_memory_allocated (every allocation)",
                "mps": "torch.mps.current_allocated_memory sampled at each streamed token",
                "cpu": "process RSS sampled at each streamed token"}


class PeakMemory:
    """Peak memory of one decode on ``device`` (see :attr:`Run.peak_memory_bytes`); ``method``
    says how it was measured there."""

    def __init__(self, device) -> None:
        import torch
        self.device = torch.device(device)
        self.method = PEAK_METHODS.get(self.device.type, PEAK_METHODS["cpu"])
        self._in_use = memory_in_use_bytes
        self.peak = 0

    def __enter__(self) -> "PeakMemory":
        import torch
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.sample()
        return self

    def sample(self) -> None:
        if self.device.type != "cuda":
            self.peak = max(self.peak, self._in_use(self.device))

    def watch(self, events: Iterator) -> Iterator:
        for event in events:
            self.sample()
            yield event

    def __exit__(self, *exc) -> None:
        import torch
        if self.device.type == "cuda":
            self.peak = int(torch.cuda.max_memory_allocated(self.device))
        else:
            self.sample()

