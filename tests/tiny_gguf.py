"""A tiny random Llama written as a float32 GGUF file (the ``gguf`` package), for the ggml
backend's tests: the same weights as the transformers model, so both backends can be compared.

Tensor names and the Q/K row permutation are those of llama.cpp's ``convert_hf_to_gguf.py``
(``LlamaModel.modify_tensors``: llama.cpp rotates interleaved pairs, transformers rotates
halves, so the converter reorders the rows of q_proj and k_proj per head).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

TOKENS = ["<eos>"] + list("abcdefghijklmnopqrstuvwxyz .,!?")  # CharTokenizer's 32 ids


class VocabTokenizer:
    """CharTokenizer plus what the ggml backend's vocabulary check reads."""

    def __init__(self, tokens=TOKENS) -> None:
        from tests.tiny import CharTokenizer
        self._chars = CharTokenizer(len(tokens))
        self.tokens = list(tokens)
        self.eos_token_id = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def convert_ids_to_tokens(self, ids):
        return [self.tokens[i] for i in ids]

    def encode(self, text):
        return self._chars.encode(text)

    def decode(self, ids, skip_special_tokens=True):
        return self._chars.decode(ids, skip_special_tokens)


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf.py ``LlamaModel.permute``: halves-rotation rows -> pairs-rotation."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_tiny_gguf(model, path: Path, tokens=TOKENS) -> Path:
    """Write ``model`` (a transformers LlamaForCausalLM, e.g. ``tests.tiny.tiny_llama``) as a
    float32 GGUF with a byte-level BPE vocabulary of ``tokens`` (one merge)."""
    import gguf
    cfg = model.config
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = cfg.hidden_size // n_head
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta") \
        or getattr(cfg, "rope_theta", 10000.0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(rope))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_vocab_size(len(tokens))
    w.add_file_type(0)  # all float32
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] + [1] * (len(tokens) - 1))  # id 0 control, the rest normal
    w.add_token_merges(["a b"])  # llama.cpp refuses a BPE vocabulary without merges
    w.add_eos_token_id(0)
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
                 "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(cfg.num_hidden_layers):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    for hf, gg in names.items():
        t = sd[hf]
        if hf.endswith("q_proj.weight"):
            t = _permute(t, n_head)
        elif hf.endswith("k_proj.weight"):
            t = _permute(t, n_kv)
        w.add_tensor(gg, np.ascontiguousarray(t.numpy().astype(np.float32)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
