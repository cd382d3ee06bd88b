"""``train-draft --init``: start from the drafter an earlier run (or a shipped head) left."""

from __future__ import annotations

from pathlib import Path

from ...core.model_spec import builtin_name

def init_folder(folder: Path) -> Path:
    """``builtin:NAME`` -> the shipped drafter's folder; any other value as given."""
    name = builtin_name(str(folder))
    if name is not None:
        from ...models.learned import BUILTIN_DIR  # lazy: imports torch; --help stays fast
        return BUILTIN_DIR / name
    return folder


def read_init(folder: Path) -> tuple[dict | None, str | None]:
    """(the drafter state in ``folder``, None), or (None, one sentence why it cannot be read).

    Reads ``checkpoint.pt`` (memory-mapped, float32: what a run leaves to resume), else the
    saved weights ``model.safetensors`` (e.g. a shipped head, ``builtin:NAME``; BF16, widened
    when loaded into the float32 drafter)."""
    import torch
    where = init_folder(folder)
    ckpt = where / "checkpoint.pt"
    if ckpt.is_file():
        try:
            return torch.load(ckpt, map_location="cpu", weights_only=False, mmap=True)["head"], None
        except Exception:  # a damaged or foreign file: one sentence
            return None, f"--init {folder}: checkpoint.pt could not be read (damaged, or not one train-draft wrote)"
    weights = where / "model.safetensors"
    if weights.is_file():
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(weights), None
        except (SafetensorError, OSError, ValueError):
            return None, f"--init {folder}: model.safetensors could not be read (damaged)"
    return None, (f"--init {folder}: no checkpoint.pt or model.safetensors there (a folder an earlier "
                  "train-draft run wrote, or builtin:NAME)")


def warm_start(drafter, folder: Path, keep_vocab: bool = False) -> str | None:
    """Load the weights of the drafter in ``folder`` (what :func:`read_init` reads: an earlier
    run's ``checkpoint.pt``, else ``model.safetensors``; ``builtin:NAME``) into ``drafter``.

    An EAGLE-3 head keeps its own draft vocabulary (``d2t``/``t2d``, built from this run's
    answers, of any size): each draft id that the earlier head's vocabulary also holds takes that
    head's ``lm_head`` row, and an id new to the vocabulary keeps its fresh row (the target's
    head row). A head trained before the data grew to new languages thus gains their ids without
    starting over. Prints how many ids carried over when the vocabularies differ.

    With ``keep_vocab`` (``--keep-draft-vocab``) the head takes the earlier head's draft
    vocabulary as it is, which must have as many ids as this run's.

    Returns:
        None, or one sentence why not (nothing to read there, a damaged file, another kind,
        other layer shapes, or with ``keep_vocab`` a vocabulary of another size); ``drafter``
        is unchanged then.
    """
    import torch
    saved, problem = read_init(folder)
    if problem:
        return problem
    mine = drafter.state_dict()
    if set(saved) != set(mine):
        return (f"--init {folder}: its drafter is another kind or layout "
                f"({len(set(saved) ^ set(mine))} weights differ by name)")
    if keep_vocab and "d2t" in mine and saved["d2t"].shape != mine["d2t"].shape:
        return (f"--init {folder} --keep-draft-vocab: its draft vocabulary has "
                f"{saved['d2t'].numel():,} ids, this run's --draft-vocab {mine['d2t'].numel():,}")
    remap = ("d2t" in mine and not keep_vocab
             and not torch.equal(saved["d2t"].to(mine["d2t"].device), mine["d2t"]))
    vocab_keys = {"d2t", "t2d", "lm_head.weight"} if remap else set()
    for name, value in saved.items():
        if name not in vocab_keys and value.shape != mine[name].shape:
            return (f"--init {folder}: its weight {name} is {tuple(value.shape)}, this run's "
                    f"{tuple(mine[name].shape)} (another target or recipe)")
    if remap and saved["lm_head.weight"].shape[1:] != mine["lm_head.weight"].shape[1:]:
        return (f"--init {folder}: its lm_head rows are {saved['lm_head.weight'].shape[1]} wide, "
                f"this run's {mine['lm_head.weight'].shape[1]} (another target)")
    if not remap:
        drafter.load_state_dict(saved)
        return None
    from ...core.drafters.vocab import target_ids  # lazy: imports torch; --help stays fast
    theirs_ids = target_ids(saved["d2t"]).cpu()
    ours_ids = target_ids(mine["d2t"]).cpu()
    row_of = torch.full((int(max(theirs_ids.max(), ours_ids.max())) + 1,), -1, dtype=torch.long)
    row_of[theirs_ids] = torch.arange(theirs_ids.numel())
    rows = row_of[ours_ids]  # (Vd,) the earlier head's row of each of our draft ids, -1 if new
    shared = rows >= 0
    head = mine["lm_head.weight"].clone()
    head[shared.to(head.device)] = saved["lm_head.weight"][rows[shared]].to(head)
    drafter.load_state_dict({**saved, "d2t": mine["d2t"], "t2d": mine["t2d"], "lm_head.weight": head})
    print(f"--init: {int(shared.sum()):,} of this run's {ours_ids.numel():,} draft ids carried over "
          f"from the earlier head's {theirs_ids.numel():,}; {int((~shared).sum()):,} new ids start "
          "from the target's head rows")
    return None

