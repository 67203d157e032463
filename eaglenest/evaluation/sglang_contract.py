"""What SGLang does with an EAGLE-3 draft folder, stated in plain Python, read from sglang's own
source (SGLANG_VERSION; not installed here: it needs CUDA).

- Its loader (`LlamaForCausalLMEagle3.load_weights` in `sglang/srt/models/llama_eagle3.py`):
  legacy names renamed, `d2t` kept as offsets, `t2d` dropped, q/k/v and gate/up stacked into one
  parameter each, a name tried as it is and then under `model.`; any other key is skipped
  without a word, so a wrong export loads and drafts badly. `load_checkpoint` replays that.
- The parameters its draft reads (`sglang_parameters`), so a key no parameter takes, or a
  parameter no key fills, is found here.
- Which hidden states the target hands the draft: eaglenest.draft.sglang (AUX_LAYER_RULES).
- `read_wheel` parses a downloaded sglang wheel (ast, no install) for the names and tables
  above, so an SGLang upgrade that changes them fails its test (tests/test_sglang_export.py).
"""

from __future__ import annotations

import ast
import hashlib
import zipfile
from pathlib import Path

import torch

from eaglenest.core.errors import EaglenestError

DRAFT_SOURCE = "sglang/srt/models/llama_eagle3.py"

# load_weights' tables, as sglang writes them.
STACKED_PARAMS = (
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
)
LEGACY_NAMES = {
    "midlayer": "layers.0",
    "aux_norm_low": "fc_norm.0",
    "aux_norm_mid": "fc_norm.1",
    "aux_norm_high": "fc_norm.2",
}
# The config attributes llama_eagle3.py reads by name (getattr or `config.x`), beside the Llama
# fields every Llama layer reads. The export writes each one.
CONFIG_NAMES = frozenset({
    "bias", "draft_vocab_size", "eagle_config", "fc_norm", "hidden_act", "hidden_size",
    "intermediate_size", "intermediate_size_mlp", "model_type", "norm_before_fc", "norm_output",
    "num_aux_hidden_states", "num_hidden_layers", "rms_norm_eps", "rope_parameters",
    "rope_scaling", "target_hidden_size", "tie_word_embeddings", "use_aux_norm", "vocab_size",
})  # fmt: skip

# The functions whose behaviour the rules and eaglenest's reference forward restate: a digest of
# each one's code (comments and layout left out), so any change in a new sglang is seen.
FINGERPRINTS = {
    "sglang/srt/models/llama.py:LlamaForCausalLM.set_eagle3_layers_to_capture": "f34dcfed438109f9",
    "sglang/srt/models/qwen2.py:Qwen2ForCausalLM.set_eagle3_layers_to_capture": "6e502ad8b9b56e23",
    "sglang/srt/models/qwen3.py:Qwen3ForCausalLM.set_eagle3_layers_to_capture": "6e502ad8b9b56e23",
    "sglang/srt/models/deepseek_v2.py:DeepseekV2ForCausalLM.set_eagle3_layers_to_capture": "061c9bdb6b9bb52a",
    "sglang/srt/models/kimi_k25.py:KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture": "ab4fb54d612095ec",
    "sglang/srt/models/llama_eagle3.py:LlamaDecoderLayer.forward": "e5cc2360c6b1462c",
    "sglang/srt/models/llama_eagle3.py:LlamaModel.forward": "6ba4304e4713070d",
    "sglang/srt/models/llama_eagle3.py:LlamaForCausalLMEagle3.load_weights": "1f66e0cd8aed9f96",
    # EAGLE-3 drafts get the target's embedding in place of their own (set_embed) when the
    # hidden sizes agree: a draft that trained its embedding would draft with another one.
    "sglang/srt/speculative/eagle_worker_v2.py:EagleDraftWorker.init_lm_head": "01d14f4b90eeeaa9",
    "sglang/srt/models/llama.py:LlamaForCausalLM.set_embed": "989b7dec0e38eba7",
}


def sglang_parameters(cfg: dict) -> dict[str, tuple[int, ...]]:
    """The parameters SGLang's LlamaForCausalLMEagle3 reads in its forward, with their shapes,
    for a draft config.json as the export writes it. (Layers after the first also hold an
    `input_layernorm` that the forward never reads: they normalise with `hidden_norm`.)"""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", h // heads)
    aux = len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    h_in = cfg["target_hidden_size"]
    params = {"model.embed_tokens.weight": (cfg["vocab_size"], h), "model.fc.weight": (h, aux * h_in)}
    if cfg["eagle_config"].get("norm_before_fc", cfg.get("norm_before_fc", False)):
        params["model.input_norm.weight"] = (aux * h_in,)
    if cfg.get("fc_norm") or cfg.get("use_aux_norm"):
        params |= {f"model.fc_norm.{i}.weight": (h_in,) for i in range(aux)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        params |= {
            p + "self_attn.qkv_proj.weight": ((heads + 2 * kv) * hd, 2 * h if i == 0 else h),
            p + "self_attn.o_proj.weight": (h, heads * hd),
            p + "mlp.gate_up_proj.weight": (2 * inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "hidden_norm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
        if i == 0:
            params[p + "input_layernorm.weight"] = (h,)  # the embeddings' norm
    params["model.norm.weight"] = (h,)
    params["lm_head.weight"] = (cfg["draft_vocab_size"], h)
    return params


def load_checkpoint(
    tensors: dict[str, torch.Tensor], cfg: dict
) -> tuple[dict, torch.Tensor | None, list[str]]:
    """SGLang's load_weights replayed on a checkpoint: (parameters by SGLang's name, stacked as
    SGLang stacks them; the draft-to-target ids SGLang derives from d2t; the keys SGLang would
    skip). Raises when a stacked parameter is not filled whole, or a shape differs."""
    expected = sglang_parameters(cfg)
    shards: dict[str, dict] = {}
    loaded: dict[str, torch.Tensor] = {}
    hot_token_id, skipped = None, []
    for key, tensor in tensors.items():
        name = key
        for legacy, new in LEGACY_NAMES.items():
            if legacy in name:
                name = name.replace(legacy, new)
        if "d2t" in name:
            hot_token_id = tensor + torch.arange(tensor.shape[0])
            continue
        if "t2d" in name:
            continue
        for param, shard_name, shard_id in STACKED_PARAMS:
            if shard_name in name:
                name = name.replace(shard_name, param)
                name = name if name in expected else f"model.{name}"
                if name in expected:
                    shards.setdefault(name, {})[shard_id] = tensor
                else:
                    skipped.append(key)
                break
        else:
            name = name if name in expected else f"model.{name}"
            if name in expected:
                loaded[name] = tensor
            else:
                skipped.append(key)
    for name, parts in shards.items():
        order = ("q", "k", "v") if name.endswith("qkv_proj.weight") else (0, 1)
        if set(parts) != set(order):
            raise EaglenestError(
                f"{name}: sglang stacks {order}, the checkpoint has {sorted(map(str, parts))}"
            )
        loaded[name] = torch.cat([parts[s] for s in order], dim=0)
    for name, tensor in loaded.items():
        if tuple(tensor.shape) != expected[name]:
            raise EaglenestError(
                f"{name}: sglang's draft has shape {expected[name]}, the checkpoint {tuple(tensor.shape)}"
            )
    return loaded, hot_token_id, skipped


def function_fingerprint(node: ast.AST) -> str:
    """The function's code with comments and layout left out (ast.unparse: steadier across
    Python versions than ast.dump)."""
    return hashlib.sha256(ast.unparse(node).encode()).hexdigest()[:16]


def _find_function(tree: ast.Module, qualname: str) -> ast.AST | None:
    cls_name, func_name = qualname.split(".")
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == func_name:
                    return item
    return None


def _literal(tree: ast.Module, function: str, variable: str):
    for node in ast.walk(_find_function(tree, function)):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == variable for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def _config_names(tree: ast.Module) -> set[str]:
    """Attributes read off the config (getattr(config, "x"), config.x, self.config.x)."""

    def is_config(node) -> bool:
        return getattr(node, "id", None) == "config" or (
            isinstance(node, ast.Attribute)
            and node.attr == "config"
            and getattr(node.value, "id", None) == "self"
        )

    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_config(node.value):
            names.add(node.attr)
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) in ("getattr", "hasattr")
            and is_config(node.args[0])
            and isinstance(node.args[1], ast.Constant)
        ):
            names.add(node.args[1].value)
    return names


def read_wheel(wheel: Path) -> dict:
    """What a sglang wheel's source says about the names above: the loader's tables, the config
    names its EAGLE-3 draft reads, and the fingerprint of each function in FINGERPRINTS (None
    where the function is gone)."""
    with zipfile.ZipFile(wheel) as z:
        trees = {}

        def tree(path):
            if path not in trees:
                trees[path] = ast.parse(z.read(path).decode())
            return trees[path]

        draft = tree(DRAFT_SOURCE)
        loader = "LlamaForCausalLMEagle3.load_weights"
        fingerprints = {}
        for key in FINGERPRINTS:
            path, qualname = key.split(":")
            node = _find_function(tree(path), qualname) if path in z.namelist() else None
            fingerprints[key] = function_fingerprint(node) if node is not None else None
        return {
            "draft_classes": [n.name for n in draft.body if isinstance(n, ast.ClassDef)],
            "stacked_params": tuple(_literal(draft, loader, "stacked_params_mapping") or ()),
            "legacy_names": _literal(draft, loader, "legacy_name_map"),
            "config_names": _config_names(draft),
            "fingerprints": fingerprints,
        }
