"""Tiny random models and a tokenizer built in-process (no hub, no files)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdemo.core.kv import KVModel


class CharTokenizer:
    """A minimal tokenizer over a fixed alphabet: id i <-> ALPHABET[i]; id 0 is EOS."""

    ALPHABET = "\0abcdefghijklmnopqrstuvwxyz .,!?"

    def __init__(self, vocab_size: int | None = None) -> None:
        self.vocab_size = vocab_size or len(self.ALPHABET)
        self.eos_token_id = 0

    def encode(self, text: str) -> list[int]:
        return [self.ALPHABET.index(c) for c in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        chars = []
        for i in ids:
            if i == 0 and skip_special_tokens:
                continue
            chars.append(self.ALPHABET[i] if i < len(self.ALPHABET) else "#")
        return "".join(chars)


def tiny_llama(seed: int = 0, vocab_size: int = 32, layers: int = 2, hidden: int = 32) -> LlamaForCausalLM:
    """A random float32 Llama with the given vocabulary (embedding rows) and depth."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=0, pad_token_id=None)
    model = LlamaForCausalLM(config).eval()
    return model


def tiny_eagle(target, draft_vocab: int | None = None, seed: int = 0, layers=None, scale: float = 1.0):
    """A random EAGLE-3 head for ``target`` (a tiny Llama): its hidden size and vocabulary, the
    given feature layers (default: inputs of layers 0, L//2, L-1) and a draft vocabulary of the
    first ``draft_vocab`` even-then-odd ids when smaller than the target's."""
    from transformers import LlamaConfig as Config

    from specdemo.core.drafters.eagle import Eagle3Head
    cfg = target.config
    torch.manual_seed(seed)
    config = Config(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                    intermediate_size=cfg.intermediate_size, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=512)
    n = cfg.num_hidden_layers
    vd = draft_vocab or cfg.vocab_size
    head = Eagle3Head(config, vd, tuple(layers or (0, n // 2, n - 1)),
                      verifier={"name_or_path": "tiny-llama"}).eval()
    if vd < cfg.vocab_size:
        order = torch.cat([torch.arange(0, cfg.vocab_size, 2), torch.arange(1, cfg.vocab_size, 2)])
        ids = order[:vd].sort().values
        head.d2t.copy_(ids - torch.arange(vd))
        head.t2d.zero_()
        head.t2d[ids] = True
    with torch.no_grad():
        head.lm_head.weight.mul_(scale)
    head.attach(target.get_input_embeddings())
    return head


def tiny_dflash(target, layer_ids=None, block_size: int = 5, seed: int = 0, mask_token_id: int | None = None,
                layers: int = 2):
    """A random DFlash assistant (transformers' MuseGlimmerAssistantModel) for ``target`` (a tiny
    Llama): its hidden size, the outputs of the given target layers (default: 0 and L-1) and the
    last id of its vocabulary as the mask token."""
    from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel
    cfg = target.config
    n = cfg.num_hidden_layers
    torch.manual_seed(seed)
    config = MuseGlimmerAssistantConfig(
        hidden_size=cfg.hidden_size, intermediate_size=2 * cfg.hidden_size, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=cfg.hidden_size // 4,
        max_position_embeddings=512, sliding_window=512, layer_types=["full_attention"] * layers,
        block_size=block_size, target_layer_ids=list(layer_ids or (0, n - 1)),
        mask_token_id=cfg.vocab_size - 1 if mask_token_id is None else mask_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=None, eos_token_id=0, pad_token_id=None)
    return MuseGlimmerAssistantModel(config).eval()


def tiny_dspark(target, feature_layers=None, block_size: int = 5, seed: int = 0,
                mask_token_id: int | None = None, layers: int = 2, draft_vocab: int | None = None,
                **options):
    """A random DSpark drafter (speculators layout, :class:`specdemo.core.drafters.dspark.
    DSparkModel`) for ``target`` (a tiny Llama): its hidden size, the given target hidden states
    (default: 1 and L), the last id as the mask token, Markov rank 8, a confidence head; a draft
    vocabulary of the even ids first when ``draft_vocab`` is given. ``options``: further config
    keys (markov_head_type, sample_from_anchor, ...)."""
    from specdemo.core.drafters.dspark import DSparkModel, new_config
    cfg = target.config
    n, h = cfg.num_hidden_layers, cfg.hidden_size
    layer = {"hidden_size": h, "intermediate_size": 2 * h, "num_hidden_layers": layers,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": h // 4,
             "vocab_size": cfg.vocab_size, "rms_norm_eps": 1e-6, "max_position_embeddings": 512,
             "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    config = new_config(layer, feature_layers or (1, n), block_size,
                        cfg.vocab_size - 1 if mask_token_id is None else mask_token_id,
                        draft_vocab_size=draft_vocab, markov_rank=8)
    config.update(options)
    torch.manual_seed(seed)
    model = DSparkModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "bias" not in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.3 if "markov" in name or "confidence" in name else 0.1)
        if model.d2t is not None:
            order = [*range(0, cfg.vocab_size, 2), *range(1, cfg.vocab_size, 2)]
            ids = torch.tensor(sorted(order[:draft_vocab]))
            model.d2t.copy_(ids - torch.arange(draft_vocab))
    return model


def tiny_gemma4(seed: int = 0, vocab_size: int = 32, hidden: int = 32):
    """A random float32 Gemma 4 text model: 4 layers (sliding, full, sliding, full), the last two
    sharing the keys/values of the first two (as Gemma 4 E2B does), per-layer embeddings on."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    torch.manual_seed(seed)
    config = Gemma4TextConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=16,
        max_position_embeddings=512, sliding_window=512, num_kv_shared_layers=2,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        hidden_size_per_layer_input=4, vocab_size_per_layer_input=vocab_size,
        bos_token_id=None, eos_token_id=0, pad_token_id=None)
    return Gemma4ForCausalLM(config).eval()


def tiny_gemma4_assistant(target, seed: int = 0, hidden: int = 24, scale: float = 1.0):
    """A random Gemma 4 assistant (Gemma4AssistantForCausalLM) for a :func:`tiny_gemma4` target."""
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4TextConfig
    cfg = target.config
    torch.manual_seed(seed)
    text = Gemma4TextConfig(
        vocab_size=cfg.vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        global_head_dim=16, max_position_embeddings=512, sliding_window=512,
        layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0, num_kv_shared_layers=2, bos_token_id=None, eos_token_id=0,
        pad_token_id=None)
    model = Gemma4AssistantForCausalLM(Gemma4AssistantConfig(
        text_config=text, backbone_hidden_size=cfg.hidden_size)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def tiny_mtp_target(seed: int = 0, vocab_size: int = 32, layers: int = 2, hidden: int = 32):
    """A random float32 GLM-4.5-style model (Glm4MoeForCausalLM, dense layers) declaring one MTP
    layer, and that layer (transformers' MtpModel, random)."""
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
    from transformers.modeling_layers import MtpModel
    torch.manual_seed(seed)
    config = Glm4MoeConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        moe_intermediate_size=hidden // 2, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=layers, num_mtp_layers=1,
        max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=None, eos_token_id=0,
        pad_token_id=None)
    model = Glm4MoeForCausalLM(config).eval()
    mtp = MtpModel(model, 1).eval()
    with torch.no_grad():  # MtpModel's own init leaves the fused expert tensors uninitialised
        for name, p in mtp.layers.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.1)
    return model, mtp


class LoadedStandIn:
    """What the target backends read of a ``models.LoadedModel``: a tiny model on the CPU in
    float32, a 32-token vocabulary, end-of-sequence id 0."""

    def __init__(self, model, backend="transformers", spec="tiny", tokenizer=None):
        self.model, self.spec, self.backend = model, spec, backend
        self.tokenizer = tokenizer or CharTokenizer()
        self.device, self.quantization, self.vocab_size = torch.device("cpu"), None, 32
        self.dtype = torch.float32
        self.eos_token_ids = frozenset({0})


def bf16_valued(module):
    """``module`` with every float32 weight replaced by its BF16 rounding (still float32): the
    native backend's BF16 kernels then differ from torch only in the order of float32 sums."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return module


class FakeClock:
    """A fake ``time`` for the engine (``monkeypatch.setattr(engine, "time", clock)``): seconds
    pass only where a test says so, so timed figures are the same however busy the machine is."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class TimedKV(KVModel):
    """A target whose forward over n tokens takes ``seconds(n)`` on ``clock``."""

    def __init__(self, model, clock: FakeClock, seconds) -> None:
        super().__init__(model)
        self.clock, self.seconds = clock, seconds

    def _run(self, ids, keep, layers):
        self.clock.now += self.seconds(len(ids))
        return super()._run(ids, keep, layers)
