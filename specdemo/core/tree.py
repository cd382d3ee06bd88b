"""Draft trees: several candidate continuations verified in one target forward (greedy only).

A chain drafter proposes one token per position; when its first guess at a position is wrong
the round ends there. A tree proposes, at some positions, the drafter's second or third guess
too, each continued on its own branch; one target forward with *tree attention* (every node
sees the context and its own ancestors, at the rotary position of its depth) scores all of them,
and verification keeps the longest branch that the target's greedy choices follow. The output
is the target's greedy output, as with a chain; only more tokens can be accepted per target
forward, at the price of a wider forward.

The tree's shape is static: a set of rank paths ``(r1, ..., rd)``, ``r`` being the rank of the
token in the drafter's distribution at that depth given the branch above it, chosen from how
often the target's own token had each rank path on calibration prompts (Medusa, Cai et al.
2024, section 3.1.2; Sequoia, Chen et al. 2024; the tree attention of SpecInfer, Miao et al.
2024, and EAGLE-2, Li et al. 2024). Sampled decoding keeps the chain, whose speculative-sampling
rule is exact; a tree with sampling needs SpecInfer's multi-draft rule, not built here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

MAX_NODES = 63  # with the root: 64 rows, one uint64 ancestor mask per row in the C forward


@runtime_checkable
class TreeTarget(Protocol):
    """A target with tree attention: ``forward_tree(ids, depth, ancestors, layers)`` ->
    (n, V) logits and (n, F) features or None; ``keep_rows(start, rows)`` keeps those KV rows."""

    def forward_tree(self, ids: list[int], depth, ancestors, layers): ...

    def keep_rows(self, start: int, rows: list[int]) -> None: ...


@dataclass(frozen=True)
class TreeShape:
    """A static draft tree as rank paths, parents before children.

    Attributes:
        paths: tuples of ranks, e.g. ``((0,), (1,), (0, 0), (0, 1), (0, 0, 0))``: the top two
            guesses at depth 1, the top two after the first guess at depth 2, then the first
            guess after that. Every proper prefix of a path is a path.
        name: shown in stats and the UI.
    """

    paths: tuple[tuple[int, ...], ...]
    name: str = "tree"

    def __post_init__(self) -> None:
        problems = shape_problems(self.paths)
        if problems:
            raise ValueError(problems)

    @property
    def depth(self) -> int:
        """The longest branch, in draft tokens."""
        return max(len(p) for p in self.paths)

    @property
    def size(self) -> int:
        """Draft nodes verified a round (the forward's width is size + 1)."""
        return len(self.paths)

    def parents(self) -> list[int]:
        """Per path, the index of its parent path (-1: the root, the context's last token)."""
        index = {p: i for i, p in enumerate(self.paths)}
        return [index[p[:-1]] if len(p) > 1 else -1 for p in self.paths]

    def cut(self, depth: int) -> "TreeShape":
        """The same tree without the nodes deeper than ``depth`` (>= 1)."""
        if depth >= self.depth:
            return self
        return TreeShape(tuple(p for p in self.paths if len(p) <= depth), self.name)

    def describe(self) -> str:
        widths = [sum(1 for p in self.paths if len(p) == d) for d in range(1, self.depth + 1)]
        return f"{self.size} nodes, depth {self.depth} (per depth {'/'.join(map(str, widths))})"


def _dotted(path) -> str:
    return ".".join(str(r) for r in path)


def shape_problems(paths) -> str | None:
    """Why ``paths`` is not a valid tree shape, in one sentence, or None."""
    if not paths:
        return "a draft tree needs at least one node"
    if len(paths) > MAX_NODES:
        return f"a draft tree holds at most {MAX_NODES} nodes, this one has {len(paths)}"
    seen: set[tuple[int, ...]] = set()
    for p in paths:
        if not p:
            return "a draft tree path is empty: write ranks separated by dots, like 0.1"
        if any(isinstance(r, bool) or not isinstance(r, int) for r in p):
            return f"tree path {p!r} holds something other than whole-number ranks"
        if any(r < 0 for r in p):
            return (f"tree path {_dotted(p)} has a negative rank: ranks count the drafter's "
                    "guesses from 0 (its first guess), like 0;1;0.0")
        if p in seen:
            return f"tree path {_dotted(p)} appears twice"
        if len(p) > 1 and p[:-1] not in seen:
            return (f"tree path {_dotted(p)} needs its parent {_dotted(p[:-1])} earlier in the "
                    "list")
        seen.add(p)
    return None


def parse_shape(text: str, name: str = "tree") -> TreeShape:
    """``"0;1;0.0;0.1;0.0.0"`` (paths separated by ``;``, ranks by ``.``) as a TreeShape.

    Raises:
        ValueError: not numbers, or not a valid tree (the reason in one sentence).
    """
    try:
        paths = tuple(tuple(int(r) for r in part.strip().split(".")) for part in text.split(";")
                      if part.strip())
    except ValueError:
        raise ValueError(f"draft tree {text!r}: write paths of ranks like 0;1;0.0;0.1;0.0.0")
    return TreeShape(paths, name)


def chain_shape(k: int) -> TreeShape:
    """The chain of k first guesses as a tree (what plain drafting verifies)."""
    return TreeShape(tuple((0,) * d for d in range(1, k + 1)), f"chain-{k}")


def build_shape(counts: dict[tuple[int, ...], int], budget: int,
                name: str = "tree") -> TreeShape:
    """The tree of at most ``budget`` nodes that contains the most calibration branches.

    Args:
        counts: {rank path: how many calibration rounds had the target's own tokens at that
            rank path} (every prefix of an observed path counted too).
        budget: nodes (1..MAX_NODES).
    Returns:
        Greedy by count (a node never counts more than its parent, so the greedy choice is a
        tree), ties broken by the shorter, then the lower-ranked path. Maximises the expected
        accepted length under the calibration counts (Sequoia's objective for a fixed size).
    """
    if not 1 <= budget <= MAX_NODES:
        raise ValueError(f"tree budget must be in 1..{MAX_NODES}, got {budget}")
    chosen: list[tuple[int, ...]] = []
    have: set[tuple[int, ...]] = set()
    for path, _ in sorted(counts.items(), key=lambda kv: (-kv[1], len(kv[0]), kv[0])):
        if len(chosen) >= budget:
            break
        if len(path) == 1 or path[:-1] in have:
            chosen.append(path)
            have.add(path)
    chosen.sort(key=lambda p: (len(p), p))
    return TreeShape(tuple(chosen), name)


# Tuned on the shipped head (builtin:smollm2-135m-eagle3) and the built-in target: calibration
# prompts of the held-out split, not the evaluation ones (docs/learned-drafters.md, "Draft
# trees"; scripts/tree_shape_eval.py).
DEFAULT_PATHS = ("0;1;2;3;0.0;0.1;0.2;1.0;2.0;0.0.0;0.0.1;0.1.0;1.0.0;0.0.0.0;0.0.0.1;"
                 "0.0.1.0")


def named_shape(value: str | None) -> TreeShape | None:
    """``off``/None -> None, ``default`` -> the shipped shape, else rank paths (parse_shape).

    Raises:
        ValueError: a shape that is not a valid tree, or a blank one (it would silently mean
            chains), in one sentence.
    """
    if value is None or value.strip().lower() in ("off", "none", "no"):
        return None
    if not value.strip():
        raise ValueError("draft tree '' holds no path: give off, default, or rank paths like "
                         "0;1;0.0;0.1;0.0.0")
    if value.strip().lower() == "default":
        return parse_shape(DEFAULT_PATHS, "default")
    return parse_shape(value)


@dataclass
class DraftTree:
    """One round's draft tree.

    Attributes:
        ids: the N node token ids (target vocabulary), parents before children.
        parents: per node, its parent's index, -1 for a child of the root.
        source: the drafter that proposed it.
    """

    ids: list[int]
    parents: list[int]
    source: str | None = None
    _children: dict[int, dict[int, int]] | None = field(default=None, repr=False)

    def rows(self) -> tuple[list[int], list[int]]:
        """The verification forward's rows, the root (row 0) then the nodes (row i + 1):
        (depth per row, ancestor bitmask per row: bit j set when row j is the row itself or
        one of its ancestors)."""
        depth, anc = [0], [1]
        for i, p in enumerate(self.parents):
            parent_row = p + 1
            depth.append(depth[parent_row] + 1)
            anc.append(anc[parent_row] | (1 << (i + 1)))
        return depth, anc

    def children(self) -> dict[int, dict[int, int]]:
        """{row: {token id: child row}} (row 0 the root)."""
        if self._children is None:
            kids: dict[int, dict[int, int]] = {}
            for i, (token, p) in enumerate(zip(self.ids, self.parents)):
                kids.setdefault(p + 1, {}).setdefault(token, i + 1)  # a repeated id: the first
            self._children = kids
        return self._children


def verify_tree_greedy(tree: DraftTree, argmax: list[int]) -> tuple[list[int], int]:
    """Walk the tree along the target's greedy choices.

    Args:
        tree: the round's tree.
        argmax: per forward row (root first, N + 1 rows), the target's greedy next token.
    Returns:
        (rows of the accepted nodes in order (row i + 1 is node i), the token after them: the
        target's correction or bonus). The accepted tokens are ``tree.ids[row - 1]``.
    """
    kids = tree.children()
    row, path = 0, []
    while True:
        nxt = kids.get(row, {}).get(argmax[row])
        if nxt is None:
            return path, argmax[row]
        path.append(nxt)
        row = nxt


class TreeOrChain:
    """Whether a learned drafter's round verifies the tree or goes by the draft-length rule.

    With a fixed draft length the user asked for the tree: always the tree. Under ``auto`` the
    tree must pay like any draft: a tree raises the tokens accepted per target forward, but its
    forward is wider (16 nodes: 17 rows), and where the target's forward cost grows with its
    width (a CPU: 29 ms for 5 rows, 92 ms for 17, SmolLM2-135M on a 2-core AVX2 EPYC) that can
    cost more than it gains; on a GPU a forward of 17 rows costs about what one of 5 does. So
    ``auto`` weighs the tree's tokens per second against its rival, the best expected rate of
    the draft-length rule (``AdaptiveDraftLength.best``: a chain of k, or a plain step when
    k = 0 wins):

    * before the tree was measured, it is tried when its best case (every level accepted,
      ``AdaptiveDraftLength.tree_rate_bound``) could beat the rival; a tree that cannot is not
      tried at all;
    * once measured (tokens emitted per second of its rounds' drafting and verification, a
      running average), it is used while it is at least the rival; after it lost, it is tried
      again after ``probe`` declined rounds, and each try that loses again doubles the wait (up
      to ``max_probe``), so a tree that never pays here costs a few dear rounds, not one in
      twelve.

    Args:
        adaptive: False: always the tree.
        probe: rounds declined before the first re-try of a tree that lost.
        max_probe: the longest wait between two re-tries.
    """

    def __init__(self, adaptive: bool, probe: int = 12, max_probe: int = 96) -> None:
        self.adaptive = adaptive
        self.probe = probe
        self.max_probe = max_probe
        self.rate: float | None = None  # tokens per second of the tree rounds (running average)
        self._rival: float | None = None  # the rival's rate when use_tree was last asked
        self._since = 0  # rounds the tree was declined since it last lost
        self._wait = probe

    def use_tree(self, rival: float | None = None, bound: float | None = None) -> bool:
        """This learned round's kind: True for the tree.

        Args:
            rival: under auto, the expected tokens per second of the draft-length rule's choice
                this round (None: nothing to weigh, the tree).
            bound: the tree's best case in tokens per second (None: unknown).
        """
        if not self.adaptive or rival is None:
            return True
        self._rival = rival
        if bound is not None and bound < rival:
            return False
        if self.rate is None or self.rate >= rival:
            return True
        self._since += 1
        return self._since > self._wait

    def record(self, tokens: int, seconds: float) -> None:
        """One tree round: ``tokens`` emitted in ``seconds`` of drafting and verifying."""
        rate = tokens / max(seconds, 1e-9)
        self.rate = rate if self.rate is None else self.rate + 0.3 * (rate - self.rate)
        if self._rival is not None and self.rate < self._rival:
            if self._since > self._wait:  # a re-try that lost again: wait twice as long
                self._wait = min(2 * self._wait, self.max_probe)
        else:
            self._wait = self.probe
        self._since = 0
