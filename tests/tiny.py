"""Tiny random models and a tokenizer built in-process (no hub, no files)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


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

    from specdemo.drafters.eagle import Eagle3Head
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
