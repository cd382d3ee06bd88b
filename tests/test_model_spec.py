"""``core/model_spec.py``: a target (or draft model) spec is one typed value, a ``str`` of its
text that says its kind; what the text says is read once, whether a bare name is a folder here
is asked of the disk when ``kind`` is read."""

import copy
import json
import pickle

import pytest

from specdemo.checks import inputs
from specdemo.core.draft_spec import DraftSpec
from specdemo.core.model_spec import (KINDS, ModelSpec, as_model_spec, builtin_name,
                                      builtin_spec, is_gguf, looks_like_path)


@pytest.mark.parametrize("text, kind, builtin, gguf", [
    ("builtin:smollm2-135m", "builtin", "smollm2-135m", False),
    ("builtin:", "builtin", "", False),
    ("builtin:x.gguf", "builtin", "x.gguf", False),  # builtin: is read first
    ("models/target.gguf", "gguf", None, True),
    ("Target.GGUF", "gguf", None, True),
    ("./no-such-folder-here", "local", None, False),
    ("/no/such/folder", "local", None, False),
    ("~/no-such-folder-here", "local", None, False),
    ("a/b/c", "local", None, False),
    ("C:\\models\\target", "local", None, False),
    ("C:target", "local", None, False),
    ("Qwen/Qwen2.5-0.5B-Instruct", "hub", None, False),
    ("no-such-model-name-here", "hub", None, False),
])
def test_each_form_has_its_kind(text, kind, builtin, gguf):
    spec = ModelSpec(text)
    assert spec.kind == kind and spec.kind in KINDS
    assert spec.builtin == builtin and spec.builtin == builtin_name(text)
    assert spec.gguf is gguf and (gguf is is_gguf(text) or kind == "builtin")
    assert spec == text and str(spec) == text and spec.text == text and type(spec.text) is str


def test_an_existing_folder_is_local_when_read_not_when_made(tmp_path, monkeypatch):
    """``org/name`` and a bare name are hub ids until a folder of that name exists here: the
    answer is the disk's when ``kind`` is read (a kept spec does not carry a stale one)."""
    monkeypatch.chdir(tmp_path)
    bare, nested = ModelSpec("mymodel"), ModelSpec("org/name")
    assert (bare.kind, nested.kind) == ("hub", "hub") and not bare.exists()
    (tmp_path / "mymodel").mkdir()
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert (bare.kind, nested.kind) == ("local", "local") and bare.exists()
    assert bare.path == tmp_path.joinpath("mymodel").relative_to(tmp_path)
    assert not ModelSpec("builtin:mymodel").exists()


def test_it_compares_prints_and_serialises_as_its_text():
    """A ``str``: equal to its text, same hash, its text in f-strings, repr and JSON, and a
    pickle or a deep copy keeps what it says; it is frozen."""
    spec = ModelSpec("builtin:smollm2-135m")
    assert spec == "builtin:smollm2-135m" and hash(spec) == hash("builtin:smollm2-135m")
    assert {spec: 1}["builtin:smollm2-135m"] == 1
    assert f"{spec}" == "builtin:smollm2-135m" and repr(spec) == "'builtin:smollm2-135m'"
    assert json.dumps({"target": spec}) == '{"target": "builtin:smollm2-135m"}'
    back = ModelSpec(json.loads(json.dumps(spec)))
    assert back == spec and back.builtin == "smollm2-135m"
    for again in (pickle.loads(pickle.dumps(spec)), copy.deepcopy(spec), copy.copy(spec)):
        assert type(again) is ModelSpec and again == spec
        assert (again.kind, again.builtin, again.gguf) == ("builtin", "smollm2-135m", False)
    with pytest.raises(AttributeError, match="frozen"):
        spec.builtin = "other"


def test_text_is_kept_as_given():
    """Blanks are the edge's business (``checks.inputs.target`` strips them)."""
    spec = ModelSpec(" builtin:smollm2-135m")
    assert spec == " builtin:smollm2-135m" and spec.builtin is None
    assert inputs.target("target", " builtin:smollm2-135m ").builtin == "smollm2-135m"


@pytest.mark.parametrize("bad", [None, 3, b"builtin:x"])
def test_what_is_not_text_is_refused(bad):
    with pytest.raises(TypeError, match="a model spec is text"):
        ModelSpec(bad)
    with pytest.raises(TypeError, match="a model spec is text"):
        as_model_spec(bad)


def test_as_model_spec_keeps_a_spec_and_wraps_text():
    spec = ModelSpec("org/name")
    assert as_model_spec(spec) is spec
    wrapped = as_model_spec("builtin:smollm2-135m")
    assert type(wrapped) is ModelSpec and wrapped.kind == "builtin"
    from_draft = as_model_spec(DraftSpec.parse("builtin:smollm2-135m"))
    assert type(from_draft) is ModelSpec and from_draft.builtin == "smollm2-135m"
    assert type(from_draft.text) is str


def test_the_target_check_returns_a_model_spec(tmp_path):
    """``--target`` leaves the edge as a ModelSpec with its kind, stripped."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    for text, kind in ((" builtin:smollm2-135m ", "builtin"), (str(gguf), "gguf"),
                       (str(tmp_path), "local"), ("Qwen/Qwen2.5-0.5B-Instruct", "hub")):
        spec = inputs.target("target", text)
        assert type(spec) is ModelSpec and spec.kind == kind and spec == text.strip()


def test_the_helpers_agree_with_the_spec():
    assert builtin_spec("x") == "builtin:x" and ModelSpec(builtin_spec("x")).builtin == "x"
    assert looks_like_path("x.gguf") and looks_like_path("./x") and not looks_like_path("org/x")


def test_presets_hold_model_specs(tmp_path):
    """Every shipped preset's target is a ModelSpec, ``default_target`` gives one (the fallback
    built-in too), and a copy of a preset made with text wraps it."""
    import dataclasses

    from specdemo.services import presets
    shipped = presets.list_presets()
    assert shipped and all(type(p.target) is ModelSpec for p in shipped)
    assert all(p.target.kind in KINDS for p in shipped)
    assert type(presets.default_target()) is ModelSpec
    fallback = presets.default_target(tmp_path)  # no preset files there
    assert type(fallback) is ModelSpec and fallback.kind == "builtin"
    again = dataclasses.replace(shipped[0], target="builtin:smollm2-135m")
    assert type(again.target) is ModelSpec and again.target.builtin == "smollm2-135m"
