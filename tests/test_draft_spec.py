"""``core/draft_spec.py``: every draft form parses into one typed value, and every refusal is one
sentence (the flag checks, presets, ``check`` and the drafter factory all read this parse)."""

import pytest

from specdemo.core.draft_spec import FORMS, DraftSpec, DraftSpecError, as_draft_spec


@pytest.mark.parametrize("text, kind, base, layers, stacked", [
    ("none", "none", "none", None, False),
    ("", "none", "", None, False),
    ("ngram", "ngram", "ngram", None, False),
    ("self", "self", "self", None, False),
    ("early-exit:8", "early-exit", "early-exit:8", 8, False),
    (" early-exit:12 ", "early-exit", "early-exit:12", 12, False),
    ("mtp", "mtp", "mtp", None, False),
    ("mtp+ngram", "mtp", "mtp", None, True),
    ("builtin:smollm2-135m", "builtin", "builtin:smollm2-135m", None, False),
    ("builtin:smollm2-135m-eagle3+ngram", "builtin", "builtin:smollm2-135m-eagle3", None, True),
    ("./drafters/eagle", "path", "./drafters/eagle", None, False),
    ("~/models/draft", "path", "~/models/draft", None, False),
    ("a/b/c", "path", "a/b/c", None, False),
    ("draft.GGUF", "path", "draft.GGUF", None, False),
    ("C:\\models\\draft", "path", "C:\\models\\draft", None, False),
    ("./eagle+ngram", "path", "./eagle", None, True),
    ("Qwen/Qwen2.5-0.5B-Instruct", "hub", "Qwen/Qwen2.5-0.5B-Instruct", None, False),
    ("org/eagle3+ngram", "hub", "org/eagle3", None, True),
    ("my-draft", "name", "my-draft", None, False),
])
def test_each_form_parses_into_its_kind(text, kind, base, layers, stacked):
    spec = DraftSpec.parse(text)
    assert (spec.kind, spec.base, spec.layers, spec.stacked) == (kind, base, layers, stacked)
    assert spec.text == str(spec) == text.strip()
    assert spec.is_model == (kind in ("mtp", "builtin", "path", "hub", "name"))


@pytest.mark.parametrize("text, message", [
    ("early-exit", "early-exit needs a layer count, e.g. early-exit:8"),
    ("early-exit:", "early-exit needs a layer count, e.g. early-exit:8"),
    ("early-exit:abc", "early-exit's layer count 'abc' is not a whole number, e.g. early-exit:8"),
    ("early-exit:2.5", "early-exit's layer count '2.5' is not a whole number, e.g. early-exit:8"),
    ("early-exit:²", "early-exit's layer count '²' is not a whole number, e.g. early-exit:8"),
    ("early-exit:0", "early-exit needs a layer count of at least 1, e.g. early-exit:8"),
    ("early-exit:-3", "early-exit needs a layer count of at least 1, e.g. early-exit:8"),
    ("early-exit:8+ngram", "+ngram stacks prompt lookup over a learned drafter, and "
                           "'early-exit:8' is not one"),
    ("ngram+ngram", "+ngram stacks prompt lookup over a learned drafter, and 'ngram' is not one"),
    ("self+ngram", "+ngram stacks prompt lookup over a learned drafter, and 'self' is not one"),
])
def test_each_refusal_is_one_sentence(text, message):
    with pytest.raises(DraftSpecError) as refused:
        DraftSpec.parse(text)
    assert str(refused.value) == message
    assert ". " not in str(refused.value).replace("e.g. ", "") and ";" not in str(refused.value)


def test_a_refused_early_exit_keeps_its_kind_and_a_value_is_frozen():
    with pytest.raises(DraftSpecError) as refused:
        DraftSpec.parse("early-exit:abc")
    assert refused.value.kind == "early-exit"
    with pytest.raises(AttributeError):
        DraftSpec.parse("ngram").kind = "self"


def test_a_spec_is_its_text_wherever_text_goes():
    """A ``DraftSpec`` compares, hashes, prints and serialises as its text (argparse fields,
    JSON, dict keys, the page's values), and survives a copy or a pickle with its parse."""
    import copy
    import json
    import pickle
    spec = DraftSpec.parse(" early-exit:4 ")
    assert spec == "early-exit:4" and {"early-exit:4": 1}[spec] == 1 and f"{spec}" == "early-exit:4"
    assert repr(spec) == "'early-exit:4'" and json.dumps({"draft": spec}) == '{"draft": "early-exit:4"}'
    assert type(spec.text) is str and type(str(spec)) is str
    for again in (pickle.loads(pickle.dumps(spec)), copy.deepcopy(spec)):
        assert isinstance(again, DraftSpec) and (again.kind, again.layers) == ("early-exit", 4)
    assert spec.is_early_exit and not spec.is_model and not DraftSpec.parse("mtp").is_early_exit


def test_as_draft_spec_parses_text_only_and_names_a_refused_one():
    spec = DraftSpec.parse("ngram")
    assert as_draft_spec(spec) is spec
    assert as_draft_spec("builtin:x+ngram").kind == "builtin"
    with pytest.raises(DraftSpecError) as refused:
        as_draft_spec("early-exit:0")
    assert str(refused.value) == ("early-exit needs a layer count of at least 1, e.g. "
                                  "early-exit:8; got 'early-exit:0'")
    assert refused.value.kind == "early-exit"


def test_the_forms_are_one_line_naming_every_kind():
    assert "\n" not in FORMS and len(FORMS) < 200
    for form in ("none", "ngram", "self", "early-exit:<layers>", "mtp", "builtin:<name>", ".gguf",
                 "org/name", "+ngram"):
        assert form in FORMS
