"""GGUF files the tests write themselves with gguf's own writer, as llama.cpp's converter lays
out a Llama: its metadata keys, a GPT-2-style BPE tokenizer, tensors under llama.cpp's names with
q and k permuted for its rotary layout, 2-D weights quantized."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def _rope_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order: each head's rotary halves interleaved (its converter's
    `permute`); transformers' GGUF reader undoes it."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(
    hf_folder: Path, out: Path, qtype_name: str = "Q8_0", architecture: str = "llama"
) -> Path:
    """The HF Llama folder `hf_folder` (config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json, chat_template.jinja) as one GGUF file, 2-D weights in `qtype_name`."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((hf_folder / "config.json").read_text())
    tok = json.loads((hf_folder / "tokenizer.json").read_text())
    tok_cfg = json.loads((hf_folder / "tokenizer_config.json").read_text())
    weights = load_file(str(hf_folder / "model.safetensors"))
    qtype = gguf.GGMLQuantizationType[qtype_name]

    w = gguf.GGUFWriter(str(out), architecture)
    w.add_name(hf_folder.name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_rope_dimension_count(cfg["hidden_size"] // cfg["num_attention_heads"])
    w.add_vocab_size(cfg["vocab_size"])

    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {t["id"] for t in tok["added_tokens"] if t["special"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for _, i in vocab])
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]])
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    w.add_eos_token_id(ids[tok_cfg["eos_token"]])
    w.add_pad_token_id(ids[tok_cfg["pad_token"]])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_add_bos_token(False)
    w.add_chat_template((hf_folder / "chat_template.jinja").read_text())

    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    names["lm_head.weight"] = "output.weight"
    per_layer = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for i in range(cfg["num_hidden_layers"]):
        for hf, cpp in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{cpp}.weight"
    for hf_name, cpp_name in names.items():
        t = weights[hf_name].astype(np.float32)
        if cpp_name.endswith("attn_q.weight"):
            t = _rope_permute(t, heads)
        elif cpp_name.endswith("attn_k.weight"):
            t = _rope_permute(t, kv_heads)
        if t.ndim == 2:
            w.add_tensor(cpp_name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(cpp_name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
