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
