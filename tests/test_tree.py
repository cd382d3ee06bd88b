"""Draft trees (core.tree): shapes, tree attention in the target forwards (transformers and the
native C forward) against separate causal forwards of each branch, the head's tree steps against
chains, and greedy decoding with trees equal to plain decoding."""

from __future__ import annotations

import pytest
import torch

from specdemo.core.drafters.combined import CombinedDrafter
from specdemo.core.drafters.eagle import Eagle3Drafter
from specdemo.core.engine import generate
from specdemo.core.kv import KVModel
from specdemo.core.policy import FixedDraftLength, make_policy
from specdemo.core.sampling import SamplingParams
from specdemo.core.tree import (DraftTree, TreeShape, build_shape, chain_shape, parse_shape,
                                verify_tree_greedy)
from specdemo.models import native as nb
from tiny import CharTokenizer, bf16_valued, tiny_eagle, tiny_llama

try:
    nb.library()
    NO_LIBRARY = None
except nb.NativeError as exc:
    NO_LIBRARY = str(exc)
needs_library = pytest.mark.skipif(NO_LIBRARY is not None, reason=f"{NO_LIBRARY}")

PROMPT = CharTokenizer().encode("speculative decoding, made visible")
SHAPE = parse_shape("0;1;2;0.0;0.1;1.0;0.0.0;0.0.1;0.0.0.0")


@pytest.fixture(scope="module")
def target():
    return bf16_valued(tiny_llama(seed=3, layers=3, hidden=64))


def test_shapes_are_checked_and_built_from_counts():
    assert chain_shape(3).paths == ((0,), (0, 0), (0, 0, 0))
    assert SHAPE.parents() == [-1, -1, -1, 0, 0, 1, 3, 3, 6]
    assert SHAPE.depth == 4 and SHAPE.size == 9
    for bad, why in (("0;0.0.1", "tree path 0.0.1 needs its parent 0.0 earlier in the list"),
                     ("0;0", "twice"), ("", "at least one"),
                     ("0;x", "paths of ranks")):
        with pytest.raises(ValueError, match=why):
            parse_shape(bad)
    counts = {(0,): 50, (1,): 20, (0, 0): 30, (2,): 5, (1, 0): 12, (0, 1): 4, (5, 0): 40}
    built = build_shape(counts, 4)
    # (5, 0) is frequent but its parent (5,) never was: not a tree node
    assert built.paths == ((0,), (1,), (0, 0), (1, 0))


def test_verification_walks_the_targets_greedy_choices():
    tree = DraftTree(ids=[7, 8, 9, 4], parents=[-1, -1, 0, 1])  # rows 1..4
    # root -> 8 (row 2) -> 4 (row 4) -> bonus 11
    assert verify_tree_greedy(tree, [8, 0, 4, 0, 11]) == ([2, 4], 11)
    # root -> 7 (row 1) -> target wants 5, not 9: correction 5
    assert verify_tree_greedy(tree, [7, 5, 0, 0, 0]) == ([1], 5)
    assert verify_tree_greedy(tree, [3, 0, 0, 0, 0]) == ([], 3)
    depth, anc = tree.rows()
    assert depth == [0, 1, 1, 2, 2]
    assert anc == [0b1, 0b11, 0b101, 0b1011, 0b10101]


def _branch_logits(model_kv_factory, prefix, branch):
    kv = model_kv_factory()
    return kv.forward(prefix + branch, len(branch))


@pytest.mark.parametrize("backend", ["transformers",
                                     pytest.param("native", marks=needs_library)])
def test_tree_forward_equals_each_branch_fed_causally_and_keeps_the_accepted_rows(target,
                                                                                 backend):
    if backend == "native":
        nm = nb.NativeModel(target, kernel="fma")
        factory = lambda: nb.NativeKV(nm)  # noqa: E731
    else:
        factory = lambda: KVModel(target)  # noqa: E731
    prefix = PROMPT[:-1]
    tree = DraftTree(ids=[7, 8, 9, 4, 12], parents=[-1, -1, 0, 1, 3])
    kv = factory()
    kv.forward(prefix)
    depth, anc = tree.rows()
    logits, feats = kv.forward_tree([PROMPT[-1]] + tree.ids, depth, anc, (0, 2))
    assert logits.shape[0] == 6 and feats.shape == (6, 2 * 64)
    # every row's logits equal those of its branch fed as an ordinary causal sequence
    for row in range(6):
        branch, r = [], row
        while r > 0:
            branch.insert(0, tree.ids[r - 1])
            r = tree.parents[r - 1] + 1
        want = _branch_logits(factory, prefix, [PROMPT[-1]] + branch)[-1]
        assert torch.allclose(logits[row], want, atol=1e-4), row
    # keep the branch root -> 8 -> 4 -> 12 (rows 0, 2, 4, 5); the cache is then the sequence's
    kv.keep_rows(len(prefix), [0, 2, 4, 5])
    assert kv.length == len(prefix) + 4
    after = kv.forward([3], 1)[-1]
    want = _branch_logits(factory, prefix, [PROMPT[-1], 8, 4, 12, 3])[-1]
    assert torch.allclose(after, want, atol=1e-4)


@pytest.mark.parametrize("stepper", ["torch", pytest.param("native", marks=needs_library)])
def test_a_tree_holds_the_chain_the_head_would_draft(target, stepper):
    """The rank-0 branch of a tree is the head's greedy chain, node for node."""
    head = bf16_valued(tiny_eagle(target, 20, seed=1))
    kv = KVModel(target)
    _, feats = kv.forward_features(PROMPT, 1, head.feature_layers)

    def drafter():
        d = Eagle3Drafter(head, 32, stepper=nb.NativeEagleHead(head, kernel="fma")
                          if stepper == "native" else None)
        d.observe(feats)
        return d

    context = PROMPT + [5]
    chain = drafter().propose(context, 4, SamplingParams(), None).ids
    tree = drafter().propose_tree(context, SHAPE)
    zero = [i for i, p in enumerate(SHAPE.paths) if set(p) == {0}]
    assert [tree.ids[i] for i in zero] == chain
    # siblings differ: the second and third guesses are other tokens
    assert len({tree.ids[0], tree.ids[1], tree.ids[2]}) == 3


@pytest.mark.parametrize("backend", ["transformers",
                                     pytest.param("native", marks=needs_library)])
@pytest.mark.parametrize("policy", ["fixed", "auto"])
@pytest.mark.parametrize("stack", [False, True])
def test_greedy_decoding_with_trees_equals_plain(target, backend, policy, stack):
    nm = nb.NativeModel(target, kernel="fma") if backend == "native" else None
    factory = (lambda: nb.NativeKV(nm)) if nm else (lambda: KVModel(target))  # noqa: E731
    plain = generate(factory(), PROMPT, CharTokenizer(), max_new_tokens=40)
    head = bf16_valued(tiny_eagle(target, 20, seed=1))
    stepper = nb.NativeEagleHead(head, kernel="fma") if nm else None
    drafter = Eagle3Drafter(head, 32, stepper=stepper)
    if stack:
        drafter = CombinedDrafter(drafter)
    pol = (make_policy("auto", {n: 1.0 for n in range(1, 18)}) if policy == "auto"
           else FixedDraftLength(4))
    spec = generate(factory(), PROMPT, CharTokenizer(), drafter=drafter, policy=pol,
                    max_new_tokens=40, tree=SHAPE)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.tree == SHAPE.describe() and spec.stats.tree_rounds > 0
    assert spec.stats.target_forwards < plain.stats.target_forwards or spec.stats.accepted == 0
    if policy == "fixed":  # every learned round a tree: per-position counters count depths
        assert len(spec.stats.per_position_acceptance) <= SHAPE.depth
        short = generate(factory(), PROMPT, CharTokenizer(), drafter=Eagle3Drafter(
            head, 32, stepper=nb.NativeEagleHead(head, kernel="fma") if nm else None),
            policy=FixedDraftLength(2), max_new_tokens=40, tree=SHAPE)
        assert short.token_ids == plain.token_ids  # k = 2 cuts the tree to depth 2 (6 nodes)
        assert short.stats.tree == SHAPE.cut(2).describe() and SHAPE.cut(2).size == 6
        assert short.stats.draft_length_max <= 6


def test_sampling_keeps_the_chain(target):
    head = tiny_eagle(target, 20, seed=1)
    params = SamplingParams(temperature=0.8, seed=1)
    out = generate(KVModel(target), PROMPT, CharTokenizer(), drafter=Eagle3Drafter(head, 32),
                   policy=FixedDraftLength(3), params=params, max_new_tokens=20, tree=SHAPE)
    assert out.stats.tree_rounds == 0 and out.stats.drafted > 0
    assert out.stats.tree == "not used: sampling keeps the chain (trees are verified greedily only)"


def test_a_drafter_or_target_without_trees_keeps_the_chain_and_says_why(target):
    from specdemo.core.drafters.ngram import NgramDrafter
    out = generate(KVModel(target), PROMPT, CharTokenizer(), drafter=NgramDrafter(),
                   policy=FixedDraftLength(3), max_new_tokens=20, tree=SHAPE)
    assert out.stats.tree_rounds == 0 and out.stats.tree.startswith("not used: the drafter")

    class NoTrees:  # a target backend without tree attention (ggml, int8)
        def __init__(self, kv):
            self.kv = kv
            self.device, self.backend = kv.device, "ggml"

        def __getattr__(self, name):
            if name in ("forward_tree", "keep_rows"):
                raise AttributeError(name)
            return getattr(self.kv, name)

    head = tiny_eagle(target, 20, seed=1)
    plain = generate(KVModel(target), PROMPT, CharTokenizer(), max_new_tokens=20)
    out = generate(NoTrees(KVModel(target)), PROMPT, CharTokenizer(),
                   drafter=Eagle3Drafter(head, 32), policy=FixedDraftLength(3),
                   max_new_tokens=20, tree=SHAPE)
    assert out.token_ids == plain.token_ids and out.stats.tree_rounds == 0
    assert out.stats.tree == "not used: the target's ggml forward has no tree attention"


def test_auto_uses_the_tree_while_it_beats_the_rule_and_tries_it_again():
    from specdemo.core.tree import TreeOrChain
    fixed = TreeOrChain(adaptive=False)
    fixed.record(1, 10.0)
    assert fixed.use_tree(rival=100.0, bound=1.0)  # asked for: always the tree
    auto = TreeOrChain(adaptive=True, probe=4, max_probe=16)
    assert not auto.use_tree(rival=50.0, bound=40.0)  # even its best case loses: never tried
    assert auto.use_tree(rival=50.0, bound=200.0)  # it could pay: first the tree is measured
    auto.record(3, 0.10)  # 30 tokens/s against the rule's 50
    kinds = []
    for _ in range(40):
        kind = auto.use_tree(rival=50.0, bound=200.0)
        kinds.append(kind)
        if kind:
            auto.record(3, 0.10)
    tried = [i for i, kind in enumerate(kinds) if kind]
    # the losing tree is tried again after 4, then 8, then 16 (the longest wait) declined rounds
    assert [tried[0]] + [b - a - 1 for a, b in zip(tried, tried[1:])] == [4, 8, 16]
    assert auto.rate == pytest.approx(30.0)
    for _ in range(12):  # the tree becomes faster (a GPU: a wide forward costs no more)
        auto.record(3, 0.03)  # 100 tokens/s
    assert all(auto.use_tree(rival=50.0, bound=200.0) for _ in range(10))
    assert not auto.use_tree(rival=150.0, bound=140.0)  # a plain step now beats its best case


def test_auto_drops_a_tree_whose_wide_forward_costs_more_than_it_can_gain(target):
    """A tree of N nodes costs a forward N + 1 wide: where that is dear (a CPU), auto does not
    try it at all; where forwards of any width cost the same (a GPU), it does. Greedy output
    equals plain either way."""
    head = tiny_eagle(target, 20, seed=1)
    plain = generate(KVModel(target), PROMPT, CharTokenizer(), max_new_tokens=24)
    runs = {}
    for name, per_token in (("dear", 1.0), ("flat", 0.0)):
        costs = {n: 1.0 + per_token * (n - 1) for n in range(1, 65)}  # seconds, by width
        spec = generate(KVModel(target), PROMPT, CharTokenizer(),
                        drafter=Eagle3Drafter(head, 32), policy=make_policy("auto", costs),
                        max_new_tokens=24, tree=SHAPE)
        assert spec.token_ids == plain.token_ids
        runs[name] = spec.stats.tree_rounds
    assert runs["dear"] == 0 and runs["flat"] > 0, runs


def test_the_page_and_api_take_a_tree_and_show_it():
    import gradio as gr
    from specdemo.core.stats import DecodeStats
    from specdemo.interfaces import ui_race
    from specdemo.interfaces.ui_format import counter_cells
    settings = ui_race._settings(0.0, 1.0, 8, -1, "auto", draft_tree="default")
    assert settings.tree is not None and settings.tree.name == "default"
    assert ui_race._settings(0.0, 1.0, 8, -1, "auto", draft_tree="off").tree is None
    with pytest.raises(gr.Error, match="draft_tree: tree path 1.1 needs its parent 1"):
        ui_race._settings(0.0, 1.0, 8, -1, "4", names={"draft_tree": "draft_tree"},
                          draft_tree="0;1.1")
    stats = DecodeStats(drafted=16, accepted=3, rounds=2, tree_rounds=1, tree=SHAPE.describe())
    cells = dict(counter_cells(stats, True, "auto"))
    assert cells["tree"] == f"{SHAPE.describe()}; 1 of 2 rounds"
    assert "tree" not in dict(counter_cells(DecodeStats(drafted=4, rounds=1), True, 4))


@pytest.mark.parametrize("command", ["run", "bench"])
def test_the_command_line_refuses_a_bad_tree_in_one_sentence(capsys, command):
    from specdemo.interfaces.cli import main
    argv = [command, "--draft-tree", "0;1.1"] + (["--out", "x"] if command == "bench"
                                                  else ["--prompt", "hi"])
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("error: argument --draft-tree: tree path 1.1 needs its parent 1 earlier "
                      "in the list")
    assert err[1:] == [f"(python -m specdemo {command} --help)"]


@pytest.mark.parametrize("spec, says", [
    ("0;-1", "tree path -1 has a negative rank: ranks count the drafter's guesses from 0 (its "
             "first guess), like 0;1;0.0"),
    ("0;0.-2", "tree path 0.-2 has a negative rank"),
    ("", "draft tree '' holds no path: give off, default, or rank paths like 0;1;0.0;0.1;0.0.0"),
    ("  ", "draft tree '' holds no path"),
    (";", "a draft tree needs at least one node"),
])
def test_a_tree_spec_is_refused_in_the_users_notation(capsys, spec, says):
    """Paths are written 0;1;0.0, so a refusal names them that way (not as Python tuples), and
    a spec with no path at all is refused rather than run as chains."""
    from specdemo.interfaces.cli import main
    with pytest.raises(SystemExit) as caught:
        main(["run", "--prompt", "hi", "--draft-tree", spec])
    assert caught.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"error: argument --draft-tree: {says}")
    assert "tuple" not in err[0] and ",)" not in err[0]  # no Python notation
    assert err[1:] == ["(python -m specdemo run --help)"]
