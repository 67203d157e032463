"""Which hidden states SGLang's target hands an EAGLE-3 draft, for the draft config to name them.

SGLang's targets capture the input of layer i for a config id, and the id each target
architecture turns into i differs (read from sglang SGLANG_VERSION's `set_eagle3_layers_to_capture`
of each model class below; eaglenest's ids are vLLM's, HF `hidden_states` indices). Torch-free:
the workflow checks a run that exports to SGLang at planning, before any GPU stage
(rules/common.smk), and draft_config checks it again once the target's config is at hand. The
rest of SGLang's contract (loader, parameters, the wheel's drift check) is
eaglenest.evaluation.sglang_contract.
"""

from __future__ import annotations

from eaglenest.core.errors import EaglenestError

SGLANG_VERSION = "0.5.23"
DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3"

# For a target architecture: (file, class) whose set_eagle3_layers_to_capture turns the draft
# config's `eagle_aux_hidden_state_layer_ids` into the layers whose input is captured, and how.
#   "plus_one": layer id + 1 (the id names the layer whose output is taken);
#   "plus_one_if_first_is_one": the ids as they are, unless the first is 1 (then + 1 each).
AUX_LAYER_RULES = {
    "LlamaForCausalLM": ("sglang/srt/models/llama.py", "LlamaForCausalLM", "plus_one"),
    "Qwen2ForCausalLM": ("sglang/srt/models/qwen2.py", "Qwen2ForCausalLM", "plus_one"),
    "Qwen3ForCausalLM": ("sglang/srt/models/qwen3.py", "Qwen3ForCausalLM", "plus_one"),
    "DeepseekV2ForCausalLM": ("sglang/srt/models/deepseek_v2.py", "DeepseekV2ForCausalLM", "plus_one_if_first_is_one"),
    # DeepseekV3ForCausalLM subclasses V2 without overriding the method.
    "DeepseekV3ForCausalLM": ("sglang/srt/models/deepseek_v2.py", "DeepseekV2ForCausalLM", "plus_one_if_first_is_one"),
    # Kimi-K2.5 hands the call to its DeepseekV3ForCausalLM language model.
    "KimiK25ForConditionalGeneration": ("sglang/srt/models/deepseek_v2.py", "DeepseekV2ForCausalLM", "plus_one_if_first_is_one"),
}  # fmt: skip


def sglang_layer_ids(vllm_ids: list[int], target_architecture: str, source) -> list[int]:
    """The `eagle_aux_hidden_state_layer_ids` that make SGLang's target capture the hidden
    states eaglenest trained on (`vllm_ids`: HF `hidden_states` indices, the input of layer i)."""
    if not target_architecture:
        raise EaglenestError(
            "the target's config.json names no architecture: sglang picks its model class by it", source
        )
    if target_architecture not in AUX_LAYER_RULES:
        raise EaglenestError(
            f"sglang {SGLANG_VERSION}: no EAGLE-3 layer capture is known for the target architecture "
            f"{target_architecture} (known: {', '.join(sorted(AUX_LAYER_RULES))}); "
            "leave sglang out of export.engines",
            source,
        )
    rule = AUX_LAYER_RULES[target_architecture][2]
    if rule == "plus_one":
        if min(vllm_ids) < 1:
            raise EaglenestError(
                f"aux layer {min(vllm_ids)} (the embeddings) cannot be asked of sglang's "
                f"{target_architecture}: it captures the output of layer id, never the input of layer 0",
                source,
            )
        return [i - 1 for i in vllm_ids]
    if vllm_ids[0] == 1:
        raise EaglenestError(
            f"aux layers {vllm_ids} cannot be asked of sglang's {target_architecture}: it adds 1 to "
            "every id when the first is 1, so a first aux layer 1 is never captured; choose another "
            "first aux layer",
            source,
        )
    return list(vllm_ids)


def captured_layers(sglang_ids: list[int], target_architecture: str) -> list[int]:
    """The layers whose input SGLang's target captures for the config ids (its own rule)."""
    rule = AUX_LAYER_RULES[target_architecture][2]
    if rule == "plus_one" or sglang_ids[0] == 1:
        return [i + 1 for i in sglang_ids]
    return list(sglang_ids)
