"""What ``train-draft`` checks before any work (nothing loaded, generated or written): the
output folder, the prompts file, the answer shards' folder, ``--init``; and, once the features'
size is known, the disk. Every refusal is a :class:`TrainingError` of one sentence.
"""

from __future__ import annotations

import json
import platform
import shutil
import sys
from pathlib import Path

from ...core import machine
from .errors import TrainingError
from .warm_start import read_init

KIND_NAMES = {"eagle3": "EAGLE-3 head", "dflash": "DFlash drafter", "dspark": "DSpark drafter"}



def a_name(name: str) -> str:
    return ("an " if name[0] in "AEIOU" else "a ") + name


def check_space(n_tokens: int, width: int, out: Path) -> None:
    """Refuse when the captured features would not fit on the disk of ``out``; say so when they
    will not fit in memory (training memory-maps them and reads each batch from the page cache,
    slower when the disk has to serve it).

    Raises:
        TrainingError: they would not fit on the disk.
    """
    import psutil
    need = n_tokens * width * 2  # float16 shards
    shards = out / "features"
    have = sum(f.stat().st_size for f in shards.glob("*.pt")) if shards.is_dir() else 0
    free_disk = shutil.disk_usage(out).free
    if need - have > 0.9 * free_disk:
        raise TrainingError(f"the features need ~{need / 1e9:.1f} GB on disk but only "
                            f"{free_disk / 1e9:.1f} GB are free under {out}; use --max-prompts "
                            "or --max-tokens, or another --out")
    free_memory = psutil.virtual_memory().available
    if need > 0.8 * free_memory:
        print(f"note: the features (~{need / 1e9:.1f} GB) exceed the free memory "
              f"({free_memory / 1e9:.1f} GB); training reads them from disk, more slowly",
              file=sys.stderr)


BF16_FLAGS = ("avx512_bf16", "amx_bf16")



def slow_bf16_note(device: str, train_dtype: str) -> str | None:
    """A warning when ``--train-dtype bfloat16`` trains on an x86 CPU without bfloat16
    instructions (none of :data:`BF16_FLAGS`): torch then emulates the products, and on a
    2-core AMD EPYC with AVX2 only a (1024, 576) x (576, 1536) bfloat16 matmul took 84 ms
    against 17 ms in float32. None elsewhere (GPUs, Arm, CPUs with AVX512-BF16 or AMX)."""
    if train_dtype != "bfloat16" or not device.startswith("cpu"):
        return None
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    flags = machine.cpu_flags().split()
    # a real x86 flags list (Linux) names sse2; elsewhere cpu_flags() is platform.machine() only,
    # which says nothing about bfloat16
    if "sse2" not in flags or any(f in flags for f in BF16_FLAGS):
        return None
    return ("note: --train-dtype bfloat16 on a CPU without AVX512-BF16 or AMX: torch emulates "
            "bfloat16 here, which can be several times slower than float32 (the default)")


def check_init(args) -> None:
    """Refuse ``--init`` before any work (nothing loaded, generated or written): no checkpoint
    there, a damaged one, or another kind of drafter.

    Raises:
        TrainingError with one sentence.
    """
    keep = getattr(args, "keep_draft_vocab", False)
    if keep and (args.init is None or args.kind != "eagle3"):
        raise TrainingError("--keep-draft-vocab keeps the draft vocabulary of the EAGLE-3 head given with "
             "--init DIR; without --init (or for a DFlash drafter, which has none) it means nothing")
    if args.init is None:
        return
    folder = args.init
    saved, problem = read_init(folder)
    if problem:
        raise TrainingError(problem)
    theirs = ("dspark" if any(k.startswith(("markov_head.", "confidence_head.")) for k in saved)
              else "eagle3" if "d2t" in saved else "dflash")
    if theirs != args.kind:
        raise TrainingError(f"--init {folder}: it holds {a_name(KIND_NAMES[theirs])}, this run trains "
             f"{a_name(KIND_NAMES[args.kind])}: give --kind {theirs}")
    if keep and saved["d2t"].numel() != args.draft_vocab:
        raise TrainingError(f"--init {folder} --keep-draft-vocab: its draft vocabulary has "
             f"{saved['d2t'].numel():,} ids; give --draft-vocab {saved['d2t'].numel()}")


def out_kind(out: Path) -> str | None:
    """Which drafter kind the run saved in ``out`` trains (``eagle3``/``dflash``/``dspark``),
    from its ``recipe.json`` (a DFlash recipe has ``block_size``, a DSpark one ``block_size`` and
    ``markov_rank``, an EAGLE-3 one ``ttt_steps``), else from ``train.json``'s ``kind``; None for
    a folder without either.

    Raises:
        TrainingError: a recipe.json that cannot be read as one (one sentence).
    """
    recipe = out / "recipe.json"
    if recipe.is_file():
        try:
            saved = json.loads(recipe.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            saved = None
        if isinstance(saved, dict) and ("block_size" in saved) != ("ttt_steps" in saved):
            if "block_size" in saved:
                return "dspark" if "markov_rank" in saved else "dflash"
            return "eagle3"
        raise TrainingError(f"--out {out}: its recipe.json is not one train-draft wrote (damaged or another "
             "program's); give another --out")
    info = out / "train.json"
    if info.is_file():
        try:
            kind = json.loads(info.read_text()).get("kind")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            kind = None
        if kind in KIND_NAMES:
            return kind
    return None


def check_inputs(args) -> list[dict]:
    """The rows of the prompts file, once ``--out``, ``--prompts`` and ``--init`` are known to be
    usable.

    Raises:
        TrainingError, with one sentence naming the file (and line): ``--out`` is a file, a
            non-empty folder of something else, or the run of another drafter kind (its
            ``recipe.json``: nothing of it is overwritten); the prompts file is missing, a folder, not
            UTF-8 text, has a line that is not a JSON object with a non-empty "prompt", or
            holds no training prompt; ``--answers-dir`` (when answers are generated) is a file
            or a folder that cannot be written or created.
    """
    from . import data, prompt_set  # lazy: imports torch; --help stays fast
    out = args.out
    if out.exists() and not out.is_dir():
        raise TrainingError(f"--out {out} is a file, not a folder: give a folder for the drafter (it is created "
             "if missing)")
    if out.exists() and any(out.iterdir()) and not args.resume and not (out / "recipe.json").exists():
        raise TrainingError(f"{out} is not empty; give --resume to continue a run there, or another folder")
    theirs = out_kind(out)
    if theirs is not None and theirs != args.kind:
        raise TrainingError(f"--out {out} holds the run of {a_name(KIND_NAMES[theirs])} (its recipe.json), this "
             f"run trains {a_name(KIND_NAMES[args.kind])}: give another --out, or --kind {theirs} to "
             f"continue that one")
    path = Path(args.prompts or prompt_set.PROMPTS_FILE)
    if not path.exists():
        raise TrainingError(f"--prompts {path}: no such file")
    if path.is_dir():
        raise TrainingError(f"--prompts {path} is a folder, not a JSONL file of {{\"prompt\": ...}} lines")
    try:
        rows = prompt_set.load(path)
    except UnicodeDecodeError as exc:
        raise TrainingError(f"--prompts {path} is not UTF-8 text (byte {exc.start}): give a JSONL file")
    except ValueError as exc:  # "<path>:<line>: expected a JSON object with a non-empty "prompt""
        raise TrainingError(f"--prompts {exc}")
    except OSError as exc:
        raise TrainingError(f"--prompts {path} cannot be read ({exc.strerror or exc})")
    if getattr(args, "scale_prompts", False):
        from . import prompt_scale
        try:
            rows = rows + [{**r, "split": "train"} for r in prompt_scale.load_scale()]
        except prompt_scale.PromptSetError as exc:
            raise TrainingError(str(exc))
    if not data.split_rows(rows, heldout=False):
        raise TrainingError(f"--prompts {path} holds no training prompts ({len(rows)} rows, none outside the "
             "held-out split): training on nothing would save an untrained drafter")
    answers_dir = getattr(args, "answers_dir", None)
    if answers_dir is not None and getattr(args, "answers", None) is None:
        from . import shards  # lazy: imports torch; --help stays fast
        problem = shards.folder_problem(answers_dir)
        if problem:
            raise TrainingError(f"--answers-dir {answers_dir} {problem}: the answers generated would have "
                 "nowhere to go; give a folder that can be written")
    check_init(args)
    return rows

