"""Export the trained draft for SGLang beside the vLLM one, from the same tensors, and check it.

SGLang (sglang_contract.SGLANG_VERSION) skips checkpoint keys it does not know and reads its
own config fields, so a wrong export loads and drafts badly without an error. This stage
refuses what SGLang would load wrongly, writes the folder its `LlamaForCausalLMEagle3` loads,
and records three checks in `eaglenest_export.json`:
- keys: SGLang's load rules, replayed on the written file, fill every parameter its draft
  reads, each with its shape, and skip no key;
- config: every field SGLang reads is there and means what eaglenest trained;
- parity: eaglenest's torch restatement of SGLang's forward (sglang_reference) on the loaded
  parameters against speculators' own draft on the vLLM export, on random inputs.
(The fourth, that the sglang source still says what the contract restates, needs the wheel:
tests/test_sglang_export.py downloads it.)
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from accelerate import init_empty_weights
from safetensors.torch import load_file, save_file
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import atomic_path, read_json
from eaglenest.draft.sglang import DRAFT_ARCHITECTURE, SGLANG_VERSION, captured_layers, sglang_layer_ids
from eaglenest.evaluation.model_card import model_card
from eaglenest.evaluation.sglang_contract import load_checkpoint, sglang_parameters
from eaglenest.evaluation.sglang_reference import ROPE_TYPES, draft_forward
from eaglenest.target.resolve import read_shape

log = logging.getLogger(__name__)

# Relative logit error SGLang's forward may show against speculators' in float32: both compute
# the same function; what differs is the order of floating-point sums.
PARITY_TOLERANCE = 1e-4
PARITY_TOKENS = 16


def refusals(cfg: dict) -> list[str]:
    """What in a vLLM export (speculators' format) SGLang would load or run differently."""
    layer = cfg["transformer_layer_config"]
    problems = []
    if cfg.get("speculators_model_type") != "eagle3":
        problems.append(
            f"algorithm {cfg.get('speculators_model_type')}: sglang's {DRAFT_ARCHITECTURE} serves eagle3 drafts only"
        )
    if layer.get("model_type") != "llama":
        problems.append(
            f"draft architecture {layer.get('model_type')}: sglang has an EAGLE-3 draft of the Llama architecture only"
        )
    if cfg.get("norm_before_residual"):
        problems.append(
            "norm_before_residual is true: sglang's first draft layer keeps the unnormalised state as its "
            "residual (it has no such flag); a run that exports to sglang trains with it false"
        )
    if cfg.get("embed_requires_grad"):
        problems.append(
            "the draft trained its embedding: sglang replaces a draft's embedding with the target's"
        )
    if layer.get("attention_bias") or layer.get("mlp_bias"):
        problems.append("the draft's layers have biases: sglang's draft layers have none")
    if cfg["fc_norm"] and cfg["norm_before_fc"]:
        problems.append("fc_norm and norm_before_fc both set: sglang would apply both")
    kinds = set(layer.get("layer_types") or ["full_attention"])
    if len(kinds) > 1:
        problems.append(
            f"draft layers of several attention kinds {sorted(kinds)}: sglang's draft window applies to all"
        )
    return problems


def sglang_config(cfg: dict, target_architecture: str, source) -> dict:
    """The config.json SGLang reads for the draft: the Llama fields at the top, the aux layer ids
    in `eagle_config` in SGLang's meaning for this target, nothing left null."""
    layer = cfg["transformer_layer_config"]
    rope = layer["rope_parameters"]
    vllm_ids = cfg["eagle_aux_hidden_state_layer_ids"]
    ids = sglang_layer_ids(vllm_ids, target_architecture, source)
    fields = (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "vocab_size",
        "max_position_embeddings",
    )  # fmt: skip
    out = {"architectures": [DRAFT_ARCHITECTURE], "model_type": "llama", **{k: layer[k] for k in fields}}
    out |= {
        # Read with hasattr: a null would be taken for the width of the target's states.
        "target_hidden_size": cfg.get("target_hidden_size") or layer["hidden_size"],
        "draft_vocab_size": cfg["draft_vocab_size"],
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bias": False,
        "rope_parameters": rope,
        # Legacy names, for readers that take rope_theta and rope_scaling.
        "rope_theta": rope["rope_theta"],
        **({"rope_scaling": rope} if rope.get("rope_type", "default") != "default" else {}),
        "norm_before_fc": bool(cfg["norm_before_fc"]),
        "fc_norm": bool(cfg["fc_norm"]),
        "norm_output": bool(cfg["norm_output"]),
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": ids,
            "use_aux_hidden_state": True,
            "norm_before_fc": bool(cfg["norm_before_fc"]),
        },
        "dtype": cfg.get("dtype", "bfloat16"),
        "eaglenest": {
            "sglang_version": SGLANG_VERSION,
            "target_architecture": target_architecture,
            "aux_layer_ids_hf": vllm_ids,
        },
    }
    return out


def renamed_for_sglang(tensors: dict, num_layers: int) -> dict:
    """speculators' later layers normalise their input with `input_layernorm`; SGLang's read
    `hidden_norm` there (their `input_layernorm` is never used)."""
    out = {}
    for key, tensor in tensors.items():
        for i in range(1, num_layers):
            if key == f"layers.{i}.input_layernorm.weight":
                key = f"layers.{i}.hidden_norm.weight"
        out[key] = tensor
    return out


def config_problems(cfg: dict, vllm_cfg: dict) -> list[str]:
    """The config contract: each field SGLang reads, checked against what eaglenest trained."""
    problems = []
    ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    if cfg["architectures"] != [DRAFT_ARCHITECTURE]:
        problems.append(f"architectures {cfg['architectures']}")
    if (
        captured_layers(ids, cfg["eaglenest"]["target_architecture"])
        != vllm_cfg["eagle_aux_hidden_state_layer_ids"]
    ):
        problems.append(
            f"eagle_config ids {ids} capture other layers than the trained {vllm_cfg['eagle_aux_hidden_state_layer_ids']}"
        )
    for key in ("target_hidden_size", "draft_vocab_size", "vocab_size", "hidden_size", "head_dim"):
        if not isinstance(cfg.get(key), int):
            problems.append(f"{key} is {cfg.get(key)!r}, not a number")
    if cfg.get("tie_word_embeddings") is not False:
        problems.append("tie_word_embeddings must be false (the draft head is its own)")
    for flag in ("norm_before_fc", "fc_norm", "norm_output"):
        if cfg.get(flag) is not bool(vllm_cfg.get(flag)):
            problems.append(f"{flag} {cfg.get(flag)!r} differs from the trained {vllm_cfg.get(flag)!r}")
    if cfg["rope_parameters"].get("rope_theta") != cfg.get("rope_theta"):
        problems.append("rope_theta differs between rope_parameters and the legacy field")
    return problems


def speculators_step(draft_dir: Path, input_ids, aux_states, positions) -> tuple[torch.Tensor, torch.Tensor]:
    """speculators' own draft (its model class, the vLLM export's weights) on one step: the
    logits and the state it hands the next step, read off its modules with hooks."""
    config = Eagle3SpeculatorConfig.from_pretrained(str(draft_dir))
    config.transformer_layer_config._attn_implementation = "sdpa"  # flex attention needs a GPU build
    # Parameters on the meta device, buffers (rope frequencies) real: no second copy of the
    # weights, the file's are assigned in float32 (9 GB at Kimi-K2.5's draft shape).
    with init_empty_weights(include_buffers=False):
        model = Eagle3DraftModel(config).eval()
    state = load_file(str(draft_dir / "model.safetensors"))
    state = {k: state.pop(k).float() if state[k].is_floating_point() else state.pop(k) for k in list(state)}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if unexpected or [k for k in missing if not k.startswith("verifier_")]:  # the trainer's, never saved
        raise EaglenestError(
            f"speculators' draft loads the export with missing {missing} and unexpected {unexpected}",
            draft_dir,
        )
    seen = {}
    model.lm_head.register_forward_hook(lambda _m, _i, out: seen.setdefault("logits", out))
    source = model.norm if config.norm_output else model.layers[-1]
    source.register_forward_hook(lambda _m, _i, out: seen.setdefault("state", out))
    with torch.no_grad():
        model(
            aux_states[None].float(),
            input_ids[None],
            torch.zeros_like(input_ids)[None],
            position_ids=positions[None],
            ttt_steps=1,
        )
    return seen["logits"][0], seen["state"][0]


def parity(vllm_dir: Path, params: dict, cfg: dict, seed: int = 0) -> dict:
    """SGLang's forward (restated) against speculators' draft on the same random inputs."""
    rope_type = cfg["rope_parameters"].get("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        return {
            "ok": None,
            "why": f"not run: the reference rotates {', '.join(ROPE_TYPES)} rope, the draft's is {rope_type}",
        }
    g = torch.Generator().manual_seed(seed)
    aux = len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    ids = torch.randint(0, cfg["vocab_size"], (PARITY_TOKENS,), generator=g)
    states = torch.randn(PARITY_TOKENS, aux * cfg["target_hidden_size"], generator=g)
    positions = torch.arange(PARITY_TOKENS)
    ours_logits, ours_state = draft_forward(
        {k: v.float() for k, v in params.items()}, cfg, ids, states, positions
    )
    theirs_logits, theirs_state = speculators_step(vllm_dir, ids, states, positions)
    logit_error = float((ours_logits - theirs_logits).abs().max() / theirs_logits.abs().max())
    state_error = float((ours_state - theirs_state).abs().max() / theirs_state.abs().max())
    return {
        "ok": logit_error <= PARITY_TOLERANCE and state_error <= PARITY_TOLERANCE,
        "tokens": PARITY_TOKENS,
        "max_relative_logit_error": logit_error,
        "max_relative_state_error": state_error,
        "tolerance": PARITY_TOLERANCE,
        "same_argmax": float((ours_logits.argmax(-1) == theirs_logits.argmax(-1)).float().mean()),
    }


def _keys_check(tensors: dict, cfg: dict) -> tuple[dict, dict]:
    """SGLang's loader replayed on `tensors`: (the keys check's record, the parameters it filled)."""
    params, hot_token_id, skipped = load_checkpoint(tensors, cfg)
    missing = sorted(set(sglang_parameters(cfg)) - set(params))
    # SGLang maps draft ids to target ids from d2t alone: they must be the ids t2d selects.
    d2t_ok = hot_token_id is not None and torch.equal(
        hot_token_id.sort().values, torch.nonzero(tensors["t2d"].bool()).flatten()
    )
    keys = {
        "ok": not missing and not skipped and d2t_ok,
        "missing": missing,
        "skipped": skipped,
        "parameters": len(params),
        "d2t_selects_t2d": d2t_ok,
    }
    return keys, params


def _export_checks(vllm_dir: Path, vllm_cfg: dict, cfg: dict, tensors: dict) -> dict:
    """The keys, config and parity checks of the export (see the module's docstring)."""
    keys, params = _keys_check(tensors, cfg)
    problems = config_problems(cfg, vllm_cfg)
    checks = {"keys": keys, "config": {"problems": problems, "ok": not problems}}
    # The forward runs on what the loader filled: with a key check failed it would prove nothing.
    checks["parity"] = (
        parity(vllm_dir, params, cfg) if keys["ok"] else {"ok": None, "why": "not run: the keys check failed"}
    )
    return checks


def _export_record(vllm_dir: Path, vllm_cfg: dict, checks: dict) -> dict:
    """eaglenest_export.json: the sglang version, the export it came from, its checks, the server flags."""
    window = vllm_cfg["transformer_layer_config"].get("sliding_window")
    sliding = "sliding_attention" in (vllm_cfg["transformer_layer_config"].get("layer_types") or [])
    return {
        "engine": "sglang",
        "sglang_version": SGLANG_VERSION,
        "from": str(vllm_dir),
        "checks": checks,
        # The draft's attention window is a server flag in sglang, not a config field.
        "server_args": [
            "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "<this folder>",
            *(["--speculative-draft-window-size", str(window)] if sliding else []),
        ],
    }  # fmt: skip


def export_sglang_stage(vllm_draft_dir, out_dir, *, target, card=None) -> dict:
    """vllm_draft_dir: export_draft's folder; `target`: the resolved target
    (eaglenest.target.resolve.Target); `card`: model_card's inputs, for the folder's README.md."""
    target_dir = target.path
    vllm_dir = Path(vllm_draft_dir)
    source = vllm_dir / "config.json"
    vllm_cfg = read_json(source)
    problems = refusals(vllm_cfg)
    if problems:
        raise EaglenestError("sglang would load this draft wrongly: " + "; ".join(problems), source)
    architecture = next(iter(read_shape(target_dir).architectures), None)
    cfg = sglang_config(vllm_cfg, architecture, source)
    tensors = renamed_for_sglang(load_file(str(vllm_dir / "model.safetensors")), cfg["num_hidden_layers"])

    checks = _export_checks(vllm_dir, vllm_cfg, cfg, tensors)
    failed = [name for name, check in checks.items() if check["ok"] is False]
    if failed:
        raise EaglenestError(
            f"the sglang export fails its {', '.join(failed)} check: {json.dumps(checks)}", out_dir
        )

    record = _export_record(vllm_dir, vllm_cfg, checks)
    with atomic_path(out_dir, is_dir=True) as tmp:
        tmp.chmod(0o755)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        (tmp / "eaglenest_export.json").write_text(json.dumps(record, indent=2) + "\n")
        if card is not None:
            (tmp / "README.md").write_text(
                model_card(engine="sglang", target=target, draft_cfg=vllm_cfg, **card)
            )
    log.info(
        "exported the draft for sglang %s to %s (aux ids %s for %s); checks: %s",
        SGLANG_VERSION,
        out_dir,
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
        architecture,
        {name: check["ok"] for name, check in checks.items()},
    )
    return record
