"""The drafters eaglenest trains (`draft.algorithm`), and what each is called by the libraries.

eagle3: speculators' `eagle3`, one draft forward pass per proposed token. p_eagle: parallel
EAGLE, speculators' `peagle`: the k tokens come from one forward pass in which positions 2..k
read a mask token, so the draft also trains its embeddings. vLLM serves both with its eagle3
proposer; P-EAGLE only drafts in parallel when the speculative config says `parallel_drafting`
(without it vLLM drafts one token at a time with a head trained for the other way, and
acceptance drops with no error), so evaluation names it explicitly. dflash: speculators'
`dflash`, a block drafter: one forward pass fills a block of k mask slots after the last
accepted token, every slot attending to the whole block. It reads the target's frozen embeddings
and head, so only its layers train; vLLM serves it with its own `dflash` method, always in
parallel.

Training reads a draft's algorithm from its draft config (draft_config writes it), so a sweep
variant's own algorithm is the one trained, exported and served.
"""

from __future__ import annotations

import re
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import read_json

# draft.algorithm -> speculators' --speculator-type, which is also the checkpoint's
# speculators_model_type.
SPECULATOR_TYPES = {"eagle3": "eagle3", "p_eagle": "peagle", "dflash": "dflash"}
ALGORITHM_OF_TYPE = {v: k for k, v in SPECULATOR_TYPES.items()}
# How reports and model cards name each.
DISPLAY_NAMES = {"eagle3": "EAGLE-3", "p_eagle": "P-EAGLE", "dflash": "DFlash"}
# The checkpoint's key for the target layers it reads (speculators' DFlash config names it
# without EAGLE's prefix; vLLM reads both).
AUX_LAYER_KEYS = {"dflash": "aux_hidden_state_layer_ids"}
# Only an EAGLE-3 draft has an SGLang export (eaglenest.evaluation.sglang_export).
SGLANG_EXPORTABLE = ("eagle3",)


def draft_algorithm(draft_cfg: dict) -> str:
    """The algorithm of a draft config (draft_config's file): eagle3 when it names none, as
    every draft config written before P-EAGLE did."""
    return draft_cfg["eaglenest"].get("algorithm", "eagle3")


def folder_algorithm(draft_dir) -> str:
    """The algorithm of a trained or exported draft folder, from speculators' config.json."""
    return ALGORITHM_OF_TYPE[read_json(Path(draft_dir) / "config.json")["speculators_model_type"]]


def is_parallel(algorithm: str) -> bool:
    """Drafts its k tokens in one pass from mask-token slots (and so needs a mask token)."""
    return algorithm in ("p_eagle", "dflash")


def trains_embeddings(algorithm: str) -> bool:
    """Trains (and saves) its own token embeddings; the others read the target's, frozen."""
    return algorithm == "p_eagle"


def aux_layer_ids_of(checkpoint_cfg: dict) -> list[int] | None:
    """The target layers a trained or exported draft reads, from its config.json."""
    algorithm = ALGORITHM_OF_TYPE.get(checkpoint_cfg.get("speculators_model_type"), "eagle3")
    return checkpoint_cfg.get(AUX_LAYER_KEYS.get(algorithm, "eagle_aux_hidden_state_layer_ids"))


# Keys of an algorithm's section that override the `train` setting of the same name instead of
# naming a flag of speculators' drafter (see algorithm_train_value).
TRAIN_OVERRIDES = ("lr", "draft_layers")
# A DFlash block reads the target's hidden states only up to the token before its anchor (the
# anchor was just sampled, so the target has no state for it yet). Measured on the default target
# (block 8, lr 0.001): one layer stays at 0.04 first-slot accuracy, two reach 0.24 within 200
# steps, so one layer is refused (check_draft_plan).
DFLASH_MIN_LAYERS = 2


def algorithm_settings(config: dict, algorithm: str) -> dict:
    """The config's settings of `algorithm`, the section named after it (draft.p_eagle), less its
    train overrides; EAGLE-3 has none ({}). A DFlash block size left unset is the evaluated
    k + 1 (the anchor and k mask slots), so the block trained is the block served; it is
    resolved here, so changing k retrains such a draft."""
    section = config["draft"].get(algorithm) or {}
    settings = {key: value for key, value in section.items() if key not in TRAIN_OVERRIDES}
    if algorithm == "dflash" and settings.get("block_size") is None:
        settings["block_size"] = config["evaluate"]["num_speculative_tokens"] + 1
    return settings


def algorithm_train_value(config: dict, algorithm: str, key: str):
    """The `train` setting `key` (one of TRAIN_OVERRIDES) a draft of `algorithm` trains with: its
    section's own value where set (DFlash learns at neither EAGLE-3's rate nor its one layer on
    the default target), else train's."""
    own = (config["draft"].get(algorithm) or {}).get(key)
    return config["train"][key] if own is None else own


def trainer_flags(algorithm: str, settings: dict, mask_token_id: int | None) -> list[str]:
    """speculators' `train` flags that choose the drafter: its type, its mask token and its
    own settings (`settings`: algorithm_settings)."""
    flags = ["--speculator-type", SPECULATOR_TYPES[algorithm]]
    if is_parallel(algorithm):
        flags += ["--mask-token-id", str(mask_token_id)]
    else:
        # EAGLE-3 never uses a mask token; naming one keeps speculators from building the
        # target's processor (image processor, remote-code tokenizer) just to pick one.
        flags += ["--mask-token-id", "0"]
    for key, value in settings.items():  # the schema names each setting as speculators' flag
        flags += [f"--{key.replace('_', '-')}", str(value)]
    if algorithm == "dflash":
        # Fixed, not settings: vLLM serves a block causally unless the checkpoint says its
        # attention is not (acceptance drops with no error), and its V1 runner ignores a block
        # that samples from the anchor.
        flags += ["--sliding-window-non-causal", "--no-sample-from-anchor"]
    return flags


def vllm_speculative_config(algorithm: str, draft_dir: str, k: int) -> dict:
    """vLLM's --speculative-config serving the draft in `draft_dir` with `k` tokens per step."""
    method = "dflash" if algorithm == "dflash" else "eagle3"  # DFlash always drafts in parallel
    spec = {"method": method, "model": draft_dir, "num_speculative_tokens": k}
    if algorithm == "p_eagle":
        spec["parallel_drafting"] = True
    return spec


def check_draft_plan(config: dict, drafts) -> None:
    """Refusals at planning, before any stage runs, for the `drafts` a run trains (its own
    first, then its sweep's; each a dict of its `algorithm` and `draft_layers`, as
    eaglenest.training.sweep resolves them). Only the run's own draft is exported to SGLang (a
    sweep's variants are served by vLLM alone), so only its algorithm must have an SGLang
    export."""
    k = config["evaluate"]["num_speculative_tokens"]
    own = drafts[0]["algorithm"]
    for draft in drafts:
        if draft["algorithm"] == "dflash" and draft["draft_layers"] < DFLASH_MIN_LAYERS:
            raise EaglenestError(
                f"a DFlash draft of {draft['draft_layers']} layer (train.draft_layers, or "
                f"draft.dflash.draft_layers, or a swept draft_layers) cannot learn: its block sees "
                "the target's states only before the token it drafts from, and one layer cannot "
                f"combine the two; use at least {DFLASH_MIN_LAYERS}"
            )
    for algorithm in dict.fromkeys(d["algorithm"] for d in drafts):
        if algorithm == "p_eagle":
            depths = config["draft"]["p_eagle"]["num_depths"]
            if k > depths:
                raise EaglenestError(
                    f"evaluate.num_speculative_tokens {k} exceeds draft.p_eagle.num_depths {depths}: "
                    "a P-EAGLE draft proposes at most the depths it was trained on"
                )
        if algorithm == "dflash":
            block = algorithm_settings(config, "dflash")["block_size"]
            if k > block - 1:
                raise EaglenestError(
                    f"evaluate.num_speculative_tokens {k} exceeds draft.dflash.block_size {block} - 1: "
                    "a DFlash block holds the anchor token and at most block_size - 1 drafted ones"
                )
    if own not in SGLANG_EXPORTABLE and "sglang" in config["export"]["engines"]:
        raise EaglenestError(
            f"export.engines names sglang, which has no export for a {own} draft "
            f"(only {', '.join(SGLANG_EXPORTABLE)}): drop sglang or train eagle3"
        )


# speculators' validation accuracy per draft position, one name per trainer: eagle3's
# `full_acc_{p}` (position p right, its earlier drafts the target's), peagle's and dflash's
# `position_{p}_acc` (slot p of one parallel pass right).
_POSITION_ACCURACY = re.compile(r"^(?:full_acc_(\d+)|position_(\d+)_acc)_epoch$")
# dflash counts the block's slots from the anchor (slot 0, never drafted), the others from the
# first drafted token.
_FIRST_DRAFTED_SLOT = {"dflash": 1}


def position_accuracies(split_metrics: dict, algorithm: str = "eagle3") -> dict[int, float]:
    """{draft position: accuracy} of one epoch's train or val metrics, position 1 being the
    first drafted token whatever the algorithm: the numbering of the served per-position
    acceptance (1..k), used everywhere eaglenest shows a position."""
    first = _FIRST_DRAFTED_SLOT.get(algorithm, 0) - 1
    found = {}
    for key, value in split_metrics.items():
        m = _POSITION_ACCURACY.match(key)
        if m:
            found[int(m.group(1) or m.group(2)) - first] = value
    return dict(sorted(found.items()))
