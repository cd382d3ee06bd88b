"""Every target backend gives the engine the same object: ``core.kv.TargetKV`` (issue 51).

The check is on the classes (each method of the Protocol present with the Protocol's parameter
names, ``cache_bytes`` a property), so it runs where a backend's library is missing, and on a
live object of each backend that can be built here."""

from __future__ import annotations

import inspect

import pytest
import torch

from specdemo.core import TARGET_BACKENDS
from specdemo.core.kv import KVModel, TargetKV
from specdemo.models import compiled_backend as cb
from specdemo.models import cuda_graph_backend as cg
from specdemo.models import ggml_backend as gg
from specdemo.models import native as nb
from tiny import tiny_llama

#: the class each family of backends runs the target on (a new family must be added here)
CLASSES = {"transformers": KVModel, "native": nb.NativeKV, "int8": cb.Int8KV, "ggml": gg.GgmlKV,
           "cuda-graphs": cg.CudaGraphKV}
METHODS = ("forward", "forward_features", "rollback", "reset")


def test_every_family_of_backends_is_checked():
    assert {facts.family for facts in TARGET_BACKENDS.values()} == set(CLASSES)


@pytest.mark.parametrize("family", sorted(CLASSES))
def test_each_backends_class_implements_the_protocol(family):
    cls = CLASSES[family]
    for name in METHODS:
        ours, theirs = inspect.signature(getattr(TargetKV, name)), inspect.signature(getattr(cls, name))
        assert list(theirs.parameters) == list(ours.parameters), (family, name)
        for p in ours.parameters.values():  # the same defaults where the Protocol has one
            if p.default is not inspect.Parameter.empty:
                assert theirs.parameters[p.name].default == p.default, (family, name, p.name)
    assert isinstance(inspect.getattr_static(cls, "cache_bytes"), property), family


def test_a_class_missing_a_method_fails_the_check():
    class Partial:  # what the check must catch: no forward_features
        model = device = None
        length, ids = 0, []
        cache_bytes = property(lambda self: 0)

        def forward(self, ids, logits_to_keep=1): ...
        def rollback(self, length): ...
        def reset(self): ...
    assert not isinstance(Partial(), TargetKV)
    with pytest.raises(AttributeError):
        getattr(Partial, "forward_features")


def test_live_backends_are_target_kvs():
    model = tiny_llama(seed=0, layers=2)
    live = [KVModel(model)]
    loaded = type("Loaded", (), {"model": model, "spec": "tiny", "device": torch.device("cpu"),
                                 "dtype": torch.float32, "quantization": None})()
    if nb.unavailable_reason(loaded) is None:
        live.append(nb.NativeKV(nb.native_model(loaded, "bf16")))
    for kv in live:
        assert isinstance(kv, TargetKV), type(kv).__name__
        kv.reset()
        logits = kv.forward([1, 2, 3], logits_to_keep=2)
        assert tuple(logits.shape) == (2, model.config.vocab_size) and kv.length == 3
        kv.rollback(1)
        assert kv.length == 1 and kv.cache_bytes >= 0
