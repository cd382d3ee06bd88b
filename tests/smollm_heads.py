"""Learned-drafter folders for builtin:smollm2-135m (hidden 576, 30 layers, 9 heads / 3 KV heads,
head_dim 64, vocab 49152) written by hand with random weights: an EAGLE-3 head in vLLM's
speculators layout and a DFlash drafter in transformers' layout. They are real-shaped (their
drafting cost is what a trained one would cost) but accept next to nothing.

    python tests/smollm_heads.py OUT_DIR     # writes OUT_DIR/eagle3 and OUT_DIR/dflash
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB, FFN = 576, 30, 9, 3, 64, 49152, 1536


def write_eagle3_head(folder: Path, layer_ids=(2, 15, 27), draft_vocab: int = 8192,
                      with_d2t: bool = True, seed: int = 0) -> Path:
    """An EAGLE-3 head in the speculators layout: ``config.json`` (speculators_model_type,
    transformer_layer_config, draft_vocab_size, eagle_aux_hidden_state_layer_ids,
    speculators_config.verifier) and ``model.safetensors`` (fc, layers.0.*, norm, lm_head, d2t,
    t2d; no embed_tokens: the target's are shared). The draft vocabulary is the first
    ``draft_vocab`` target ids."""
    from safetensors.torch import save_file
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    state = {
        "fc.weight": rand(HIDDEN, 3 * HIDDEN),
        "layers.0.input_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        "layers.0.hidden_norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        "layers.0.post_attention_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        "layers.0.self_attn.q_proj.weight": rand(q, 2 * HIDDEN),
        "layers.0.self_attn.k_proj.weight": rand(kv, 2 * HIDDEN),
        "layers.0.self_attn.v_proj.weight": rand(kv, 2 * HIDDEN),
        "layers.0.self_attn.o_proj.weight": rand(HIDDEN, q),
        "layers.0.mlp.gate_proj.weight": rand(FFN, HIDDEN),
        "layers.0.mlp.up_proj.weight": rand(FFN, HIDDEN),
        "layers.0.mlp.down_proj.weight": rand(HIDDEN, FFN),
        "norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        "lm_head.weight": rand(draft_vocab, HIDDEN),
    }
    if with_d2t:
        state["d2t"] = torch.zeros(draft_vocab, dtype=torch.int64)  # draft id i -> target id i
        t2d = torch.zeros(VOCAB, dtype=torch.bool)
        t2d[:draft_vocab] = True
        state["t2d"] = t2d
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "transformer_layer_config": {
            "model_type": "llama", "hidden_size": HIDDEN, "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "intermediate_size": FFN,
            "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
            "vocab_size": VOCAB, "num_hidden_layers": 1, "hidden_act": "silu"},
        "draft_vocab_size": draft_vocab,
        "norm_before_residual": False,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": list(layer_ids),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 4,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
                         "architectures": ["LlamaForCausalLM"]}},
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def write_dflash(folder: Path, draft_layers: int = 3, block_size: int = 16, seed: int = 0) -> Path:
    """A DFlash drafter shaped as z-lab builds them (layers like the target's, reading the outputs
    of evenly spaced target layers from 1 to L-3: [1, 14, 27] for 3 draft layers), saved with
    transformers' ``MuseGlimmerAssistantModel.save_pretrained``. SmolLM2's tokenizer fills all
    49,152 rows, so the mask token reuses id 0 (<|endoftext|>, never generated mid-text)."""
    from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel
    step = (LAYERS - 3 - 1) / max(draft_layers - 1, 1)
    ids = [round(1 + i * step) for i in range(draft_layers)]
    torch.manual_seed(seed)
    config = MuseGlimmerAssistantConfig(
        hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=draft_layers,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        max_position_embeddings=8192, sliding_window=8192,
        layer_types=["full_attention"] * draft_layers, block_size=block_size, mask_token_id=0,
        target_layer_ids=ids, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    MuseGlimmerAssistantModel(config).to(torch.bfloat16).save_pretrained(folder)
    return Path(folder)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    print(write_eagle3_head(out / "eagle3"))
    print(write_dflash(out / "dflash"))
