"""SGLang's EAGLE-3 draft forward (`LlamaForCausalLMEagle3`, sglang SGLANG_VERSION) restated in
plain torch for one sequence, written from reading `sglang/srt/models/llama_eagle3.py`: the
parameters are SGLang's (stacked q/k/v and gate/up, as `sglang_contract.load_checkpoint` gives
them), so running it on an export checks the loader's view of the file and the forward together.

What it restates: the auxiliary states normalised (one norm of the concatenation, or one per
state) and projected by `fc`; the first layer normalising the embeddings and the projected
states apart, attending over their concatenation and keeping the *unnormalised* projected state
as its residual (SGLang has no `norm_before_residual`); later layers normalising with
`hidden_norm`; the final norm; the draft head over the draft vocabulary; the state handed to the
next draft step (after the final norm with `norm_output`, before it otherwise). Attention is
causal over the sequence, rope neox-style (as SGLang's Llama layers rotate).
"""

from __future__ import annotations

import math

import torch

from eaglenest.core.errors import EaglenestError

# rope types this reference rotates; others are refused rather than approximated.
ROPE_TYPES = ("default", "linear", "yarn")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_frequencies(rope: dict, dim: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [dim / 2], the factor cos and sin are scaled by), as SGLang's rope
    factory builds them from a `rope_parameters` dict (YaRN: sglang's yarn.py, its keys only:
    beta_fast, beta_slow, extrapolation_factor, attn_factor, mscale, mscale_all_dim, truncate,
    original_max_position_embeddings)."""
    kind = rope.get("rope_type", "default")
    if kind not in ROPE_TYPES:
        raise EaglenestError(f"the sglang reference forward rotates rope types {ROPE_TYPES}, not {kind}")
    base = rope["rope_theta"]
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if kind == "default":
        return 1.0 / pos_freqs, 1.0
    factor = rope.get("factor", 1.0)
    if kind == "linear":
        return 1.0 / (factor * pos_freqs), 1.0

    def correction_dim(rotations: float) -> float:
        return (
            dim
            * math.log(rope["original_max_position_embeddings"] / (rotations * 2 * math.pi))
            / (2 * math.log(base))
        )

    low, high = correction_dim(rope.get("beta_fast", 32)), correction_dim(rope.get("beta_slow", 1))
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolated = (1 - ramp) * rope.get("extrapolation_factor", 1)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolated) + (1.0 / pos_freqs) * extrapolated
    if rope.get("mscale") is not None and rope.get("mscale_all_dim") is not None:
        scale = yarn_mscale(factor, rope["mscale"]) / yarn_mscale(factor, rope["mscale_all_dim"])
    else:
        scale = yarn_mscale(factor)
    return inv_freq, scale * rope.get("attn_factor", 1)


def rotate(x: torch.Tensor, positions: torch.Tensor, rope: dict) -> torch.Tensor:
    """x: [tokens, heads, head_dim]; neox layout (the halves of head_dim pair up)."""
    dim = x.shape[-1]
    inv_freq, scale = rope_frequencies(rope, dim)
    angles = positions.double()[:, None] * inv_freq[None, :]
    cos, sin = (
        torch.cat([f(angles) * scale] * 2, dim=-1)[:, None, :].to(x.dtype) for f in (torch.cos, torch.sin)
    )
    first, second = x[..., : dim // 2], x[..., dim // 2 :]
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def attention(x: torch.Tensor, p: dict, prefix: str, cfg: dict, positions: torch.Tensor) -> torch.Tensor:
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", cfg["hidden_size"] // heads)
    q, k, v = (x @ p[prefix + "qkv_proj.weight"].float().T).split([heads * hd, kv * hd, kv * hd], dim=-1)
    # SGLang's YaRN falls back on the context length for the original one.
    rope = {"original_max_position_embeddings": cfg["max_position_embeddings"], **cfg["rope_parameters"]}
    q = rotate(q.view(-1, heads, hd), positions, rope)
    k = rotate(k.view(-1, kv, hd), positions, rope)
    v = v.view(-1, kv, hd)
    k, v = (t.repeat_interleave(heads // kv, dim=1) for t in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
    causal = torch.ones(len(x), len(x), dtype=torch.bool).tril()
    weights = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    out = torch.einsum("hqk,khd->qhd", weights, v).reshape(len(x), heads * hd)
    return out @ p[prefix + "o_proj.weight"].float().T


def mlp(x: torch.Tensor, p: dict, prefix: str) -> torch.Tensor:
    gate, up = (x @ p[prefix + "gate_up_proj.weight"].float().T).chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up) @ p[prefix + "down_proj.weight"].float().T


def draft_forward(
    params: dict, cfg: dict, input_ids: torch.Tensor, aux_states: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One draft step over a sequence, as SGLang's draft extends it: input_ids [T], aux_states
    [T, aux * target_hidden] (the target's captured states, concatenated), positions [T].
    Returns (logits over the draft vocabulary [T, draft_vocab], the state for the next step [T, H]),
    in float32 whatever the weights' dtype (each weight is cast where it is used: at Kimi-K2.5's
    shape a float32 copy of them all would be 9 GB)."""
    eps = cfg["rms_norm_eps"]
    aux = len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    embeds = params["model.embed_tokens.weight"][input_ids].float()
    hidden = aux_states.float()
    if "model.input_norm.weight" in params:
        hidden = rms_norm(hidden, params["model.input_norm.weight"], eps)
    if "model.fc_norm.0.weight" in params:
        chunks = hidden.chunk(aux, dim=-1)
        hidden = torch.cat(
            [rms_norm(c, params[f"model.fc_norm.{i}.weight"], eps) for i, c in enumerate(chunks)], -1
        )
    hidden = hidden @ params["model.fc.weight"].float().T
    residual = None
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        if i == 0:
            residual = hidden  # the projected state before hidden_norm
            x = torch.cat(
                [
                    rms_norm(embeds, params[p + "input_layernorm.weight"], eps),
                    rms_norm(hidden, params[p + "hidden_norm.weight"], eps),
                ],
                dim=-1,
            )
        else:
            residual = hidden + residual
            x = rms_norm(residual, params[p + "hidden_norm.weight"], eps)
        attn = attention(x, params, p + "self_attn.", cfg, positions)
        residual = attn + residual
        hidden = mlp(
            rms_norm(residual, params[p + "post_attention_layernorm.weight"], eps), params, p + "mlp."
        )
    out = hidden + residual
    normed = rms_norm(out, params["model.norm.weight"], eps)
    logits = normed @ params["lm_head.weight"].float().T
    return logits, normed if cfg.get("norm_output") else out
