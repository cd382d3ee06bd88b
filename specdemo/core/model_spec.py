"""A model spec (``--target``, a preset's ``target``, a draft model) as a typed value,
:class:`ModelSpec`: a ``str`` of its text that carries what its text says, handed inwards as it
is (:func:`as_model_spec` wraps what still comes as text); and ``builtin:NAME``, the one place
that reads a built-in model's name out of a spec (:func:`builtin_name`; every layer asks it, or
``ModelSpec.builtin``, rather than cutting the text itself). No torch, no network.

The forms (README, "Command line"):

=========================  ===========  ===================================================
text                       ``kind``     what is loaded
=========================  ===========  ===================================================
``builtin:<name>``         builtin      a built-in model (``models/builtin.py``)
``x.gguf`` (any case)      gguf         a GGUF file
``./dir``, ``/x``, ``~/x``  local        a path on this machine: written as one (also
``a/b/c``, ``C:\\x``                     ``\\`` in it), or any other text naming an existing
                                        file or folder
``org/name``, ``name``     hub          a Hugging Face id
=========================  ===========  ===================================================

What the text says (``builtin``, a ``.gguf`` suffix, written as a path) is read once, on
construction, from the text alone. Whether ``org/name`` or ``name`` is a folder here is a
question of the disk *now*, so :attr:`ModelSpec.kind` asks it when read (one ``stat``, only for
those two forms) instead of keeping an answer that a pickled or long-kept spec would carry stale.
Whether a spec exists, can be obtained or loads is asked elsewhere (``checks/inputs.py``,
``models/loading.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

PREFIX = "builtin:"
#: the kinds of :attr:`ModelSpec.kind`
KINDS = ("builtin", "gguf", "local", "hub")
_DRIVE = re.compile(r"[A-Za-z]:")


def builtin_name(spec: str) -> str | None:
    """The NAME of ``builtin:NAME`` (may be empty), or None for a spec of any other form."""
    return spec[len(PREFIX):] if spec.startswith("builtin:") else None


def builtin_spec(name: str) -> str:
    """``builtin:NAME``: the spec that names the built-in ``name``."""
    return PREFIX + name


def is_gguf(spec: str) -> bool:
    """True when ``spec`` names a GGUF file: it ends in ``.gguf``, any case (text only)."""
    return spec.lower().endswith(".gguf")


def looks_like_path(spec: str) -> bool:
    """A local path rather than a hub id (``org/name``) or a named drafter (text only): it
    starts with ``.``, ``/`` or ``~``, has two slashes or more, a backslash, or names a GGUF
    file."""
    return (spec.startswith((".", "/", "~")) or spec.count("/") > 1 or "\\" in spec
            or is_gguf(spec))


class FrozenText(str):
    """A ``str`` of a spec's text that carries fields read from it (:class:`ModelSpec`,
    ``core.draft_spec.DraftSpec``): it compares, hashes, prints and serialises as its text;
    its fields are set once, by :meth:`_fields`, and never again.

    Raises:
        AttributeError: setting an attribute after construction.
    """

    __slots__ = ()

    def _fields(self, **values) -> None:
        """Set the fields on construction (the only time they are set)."""
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"a {type(self).__name__} is frozen: cannot set {name}")

    @property
    def text(self) -> str:
        """The spec's text as a plain ``str``."""
        return str.__str__(self)

    def __str__(self) -> str:
        return self.text


class ModelSpec(FrozenText):
    """One model spec: the text itself, exactly as given (a ``str``: it compares, hashes,
    prints and serialises as its text, so argparse fields, JSON, presets and the page's values
    carry it as they are), with what its form says. Frozen; pickles as its text.

    Attributes:
        builtin: the NAME of ``builtin:NAME`` (may be empty), else None.
        gguf: True when the text ends in ``.gguf`` (any case).
        kind: builtin, gguf, local or hub (module doc; reads the disk for ``org/name`` and a
            bare ``name``).

    Raises:
        TypeError: on construction, ``text`` that is not a ``str`` (None, a number, a Path).
    """

    __slots__ = ("builtin", "gguf", "_written_as_path")
    builtin: str | None
    gguf: bool

    def __new__(cls, text: str) -> ModelSpec:
        """The spec of ``text`` (kept as given: blanks are the edge's business)."""
        if not isinstance(text, str):
            raise TypeError(f"a model spec is text, not {type(text).__name__}: {text!r}")
        spec = super().__new__(cls, text)
        plain = str.__str__(spec)
        name = builtin_name(plain)
        gguf = name is None and is_gguf(plain)
        written = name is None and not gguf and (looks_like_path(plain)
                                                 or _DRIVE.match(plain) is not None)
        spec._fields(builtin=name, gguf=gguf, _written_as_path=written)
        return spec

    def __reduce__(self):
        return (ModelSpec, (str(self),))

    @property
    def kind(self) -> str:
        """``builtin``, ``gguf``, ``local`` or ``hub``. Text decides the first two and a spec
        written as a path; ``org/name`` or a bare ``name`` is ``local`` when a file or folder
        of that name exists now (asked on each read, ``~`` expanded), else ``hub``."""
        if self.builtin is not None:
            return "builtin"
        if self.gguf:
            return "gguf"
        if self._written_as_path or self.exists():
            return "local"
        return "hub"

    @property
    def path(self) -> Path:
        """The text as a local path, ``~`` expanded (whether or not it exists)."""
        return Path(self.text).expanduser()

    def exists(self) -> bool:
        """True when a file or folder of this name exists on this machine now (``~``
        expanded); False for a built-in."""
        return self.builtin is None and self.path.exists()


def as_model_spec(spec: str | ModelSpec) -> ModelSpec:
    """``spec`` as a :class:`ModelSpec`: itself when it is one already (made at the edge: a
    ``--target`` flag, a preset), else the spec of its text (a ``DraftSpec`` or another ``str``
    subclass by its plain text).

    Raises:
        TypeError: ``spec`` is not text.
    """
    if isinstance(spec, ModelSpec):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"a model spec is text, not {type(spec).__name__}: {spec!r}")
    return ModelSpec(str.__str__(spec))
