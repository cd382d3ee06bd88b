"""A new user's typos on the command line: a mistyped subcommand or flag is refused with the one it
looks like, and every subcommand's ``--help`` answers (exit status 0) without importing torch."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specdemo.interfaces import cli

ROOT = Path(__file__).resolve().parent.parent


def refusal(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, meant", [
    (["chekc"], "did you mean check?"),
    (["--hlep"], "did you mean --help?"),
    (["bench", "--draft-lenght", "4"], "did you mean --draft-lengths?"),
    (["run", "--promt", "hi"], "did you mean --prompt?"),
    (["run", "--prompt", "hi", "--max-new-tokns=8"], "did you mean --max-new-tokens?"),
    (["check", "--target", "builtin:smollm2-135m", "--drafft", "ngram"], "did you mean --draft?"),
    (["presets", "--jsn"], "did you mean --json?"),
])
def test_a_mistyped_subcommand_or_flag_gets_the_one_it_looks_like(argv, meant, capsys):
    """``bench --draft-lenght 4`` said "the following arguments are required: --out" and
    nothing of the typo; a mistyped flag elsewhere, "unrecognized arguments" without a hint."""
    err = refusal(argv, capsys)
    assert meant in err and "required" not in err, err
    assert err.count("\n") == 2  # one line and the help pointer: no usage block


def test_an_unknown_flag_like_no_other_is_refused_without_a_guess(capsys):
    err = refusal(["run", "--prompt", "hi", "--zzzzzz"], capsys)
    assert err.startswith("error: unrecognized argument: --zzzzzz\n") and "did you mean" not in err


def test_abbreviations_and_values_that_look_like_flags_still_pass():
    parser = cli.build_parser()
    args = parser.parse_args(["run", "--draft-len", "4", "--prompt", "hi"])
    assert args.draft_length == 4 and args.prompt == "hi"  # argparse's abbreviation of a flag
    assert parser.parse_args(["run", "--prompt=--verbose"]).prompt == "--verbose"  # a value


def test_every_subcommands_help_answers_without_loading_torch():
    """Each subcommand's ``--help``: exit status 0, its usage line, and no torch imported (what
    makes a help slow: the subcommand modules import their work lazily)."""
    commands = sorted(cli.build_parser()._subparsers._group_actions[0].choices)
    assert {"run", "compare", "bench", "check", "presets", "costs", "serve", "train-draft",
            "shards"} <= set(commands)
    script = (
        "import contextlib, io, json, sys\n"
        "from specdemo.interfaces import cli\n"
        "out = {}\n"
        f"for name in {commands!r}:\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf):\n"
        "        try:\n"
        "            cli.main([name, '--help'])\n"
        "            code = None\n"
        "        except SystemExit as exc:\n"
        "            code = exc.code\n"
        "    out[name] = [code, buf.getvalue().splitlines()[0], 'torch' in sys.modules]\n"
        "print(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for name, (code, usage, torch_loaded) in json.loads(done.stdout).items():
        assert code == 0 and usage.startswith(f"usage: python -m specdemo {name}"), (name, usage)
        assert not torch_loaded, name


def subcommands() -> dict:
    """Every subcommand's parser, by name."""
    return cli.build_parser()._subparsers._group_actions[0].choices


def test_the_readme_lists_every_subcommand():
    """The README's command list names every subcommand ``python -m specdemo --help`` lists."""
    readme = (ROOT / "README.md").read_text()
    listed = {line.split()[3] for line in readme.splitlines()
              if line.startswith("python -m specdemo ")}
    assert set(subcommands()) <= listed, sorted(set(subcommands()) - listed)


@pytest.mark.parametrize("command, flags", [
    ("run", ("--max-new-tokens", "--temperature", "--top-k", "--top-p", "--repetition-penalty",
             "--seed")),
    ("compare", ("--max-new-tokens", "--temperature", "--top-k", "--top-p",
                 "--repetition-penalty", "--seed")),
    ("bench", ("--max-new-tokens", "--repeats", "--temperature", "--seed")),
])
def test_the_sampling_flags_help_says_their_defaults(command, flags):
    """Each flag's ``--help`` text says what it does and its default (argparse's value)."""
    actions = {a.option_strings[0]: a for a in subcommands()[command]._actions if a.option_strings}
    for flag in flags:
        action = actions[flag]
        assert action.help and "%(default)s" in action.help, (command, flag, action.help)
        assert len(action.help.replace("(default %(default)s)", "").strip()) > 10, (command, flag)


@pytest.mark.parametrize("argv, meant", [
    (["--prot", "1"], "error: unrecognized argument: --prot (did you mean --port?)"),
    (["--no-brwser"], "error: unrecognized argument: --no-brwser (did you mean --no-browser?)"),
    (["--backend", "nativ"], "(did you mean native?)"),
])
def test_app_refuses_a_typo_as_the_command_line_does(argv, meant, capsys):
    """``python app.py --prot 1`` printed argparse's whole usage block, then "unrecognized
    arguments" without the flag it looks like; it now refuses as ``python -m specdemo`` does:
    one line with the guess and the help pointer, exit status 2."""
    sys.path.insert(0, str(ROOT))
    try:
        import app
    finally:
        sys.path.remove(str(ROOT))
    with pytest.raises(SystemExit) as exc:
        app.parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert meant in err and "usage:" not in err, err
    assert err.endswith("(python app.py --help)\n") and err.count("\n") == 2, err
    assert app.parse_args(["--port", "7861", "--no-browser"]).port == 7861  # good flags pass
