"""``run`` and ``compare`` take ``--preset`` as ``bench`` does (a new user could not reproduce the
app's default pairing from the command line: found in a fresh-clone trial)."""

import argparse

import pytest

from specdemo.interfaces import decode_cli
from specdemo.services.presets import default_preset, get_preset


def parsed(*argv):
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    decode_cli.register(sub)
    args = parser.parse_args(list(argv))
    decode_cli.resolve_decode_args(args)
    return args


def test_without_a_preset_the_defaults_are_as_before():
    args = parsed("compare", "--prompt", "hi")
    assert (args.target, args.draft, args.draft_length, args.dtype, args.quantization) == (
        "builtin:smollm2-135m", "ngram", 4, "auto", None)
    assert parsed("run", "--prompt", "hi").draft == "none"


def test_the_default_preset_sets_target_draft_and_draft_length():
    preset = default_preset()
    args = parsed("compare", "--prompt", "hi", "--preset", preset.name)
    assert (args.target, args.draft, args.draft_length, args.dtype) == (
        preset.target, preset.draft, preset.draft_length, preset.dtype)
    assert args.draft_length == "auto" and "eagle3" in args.draft  # the app's default pairing


def test_flags_beside_a_preset_override_its_settings():
    name = default_preset().name
    args = parsed("run", "--prompt", "hi", "--preset", name, "--draft-length", "3",
                  "--dtype", "float32")
    assert args.draft_length == 3 and args.dtype == "float32"
    assert args.draft == get_preset(name).draft


@pytest.mark.parametrize("extra", [["--target", "builtin:smollm2-135m"], ["--draft", "ngram"]])
def test_a_preset_with_target_or_draft_is_refused(capsys, extra):
    with pytest.raises(SystemExit) as exc:
        parsed("compare", "--prompt", "hi", "--preset", default_preset().name, *extra)
    assert exc.value.code == 2
    assert "either --preset or --target/--draft" in capsys.readouterr().err


def test_an_unknown_preset_is_one_sentence_naming_the_known_ones(capsys):
    with pytest.raises(SystemExit) as exc:
        parsed("compare", "--prompt", "hi", "--preset", "no-such-preset")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "no-such-preset" in err and default_preset().name in err and "Traceback" not in err


def test_the_policy_line_says_when_auto_weighs_confidence(monkeypatch):
    from specdemo.core.stats import DecodeStats
    s = DecodeStats()
    s.record_round(3, 2, 3, "eagle3")
    monkeypatch.delenv("SPECDEMO_DRAFT_CONFIDENCE", raising=False)
    assert decode_cli.draft_length_text("auto", s).startswith("auto (k used")
    monkeypatch.setenv("SPECDEMO_DRAFT_CONFIDENCE", "1")
    assert "confidence" in decode_cli.draft_length_text("auto", s)
    assert decode_cli.draft_length_text(4, s).startswith("4 (k used")  # a fixed k is not affected
