"""The drafters eaglenest trains (`draft.algorithm`), and what each is called by the libraries.

eagle3: speculators' `eagle3`, one draft forward pass per proposed token. p_eagle: parallel
EAGLE, speculators' `peagle`: the k tokens come from one forward pass in which positions 2..k
read a mask token, so the draft also trains its embeddings. vLLM serves both with its eagle3
proposer; P-EAGLE only drafts in parallel when the speculative config says `parallel_drafting`
(without it vLLM drafts one token at a time with a head trained for the other way, and
acceptance drops with no error), so evaluation names it explicitly.

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
SPECULATOR_TYPES = {"eagle3": "eagle3", "p_eagle": "peagle"}
ALGORITHM_OF_TYPE = {v: k for k, v in SPECULATOR_TYPES.items()}
# How reports and model cards name each.
DISPLAY_NAMES = {"eagle3": "EAGLE-3", "p_eagle": "P-EAGLE"}
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
    return algorithm == "p_eagle"


def algorithm_settings(config: dict, algorithm: str) -> dict:
    """The config's settings of `algorithm`, the section named after it (draft.p_eagle); EAGLE-3
    has none ({})."""
    return dict(config["draft"].get(algorithm) or {})


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
    return flags


def vllm_speculative_config(algorithm: str, draft_dir: str, k: int) -> dict:
    """vLLM's --speculative-config serving the draft in `draft_dir` with `k` tokens per step."""
    spec = {"method": "eagle3", "model": draft_dir, "num_speculative_tokens": k}
    if is_parallel(algorithm):
        spec["parallel_drafting"] = True
    return spec


def check_draft_plan(config: dict, algorithms) -> None:
    """Refusals at planning, before any stage runs, for the `algorithms` a run trains (its
    own first, then its sweep's). Only the run's own draft is exported to SGLang (a sweep's
    variants are served by vLLM alone), so only its algorithm must have an SGLang export."""
    k = config["evaluate"]["num_speculative_tokens"]
    own, *_ = algorithms
    for algorithm in dict.fromkeys(algorithms):
        if algorithm == "p_eagle":
            depths = config["draft"]["p_eagle"]["num_depths"]
            if k > depths:
                raise EaglenestError(
                    f"evaluate.num_speculative_tokens {k} exceeds draft.p_eagle.num_depths {depths}: "
                    "a P-EAGLE draft proposes at most the depths it was trained on"
                )
    if own not in SGLANG_EXPORTABLE and "sglang" in config["export"]["engines"]:
        raise EaglenestError(
            f"export.engines names sglang, which has no export for a {own} draft "
            f"(only {', '.join(SGLANG_EXPORTABLE)}): drop sglang or train eagle3"
        )


# speculators' validation accuracy per draft position, one name per trainer: eagle3's
# `full_acc_{p}` (position p right, its earlier drafts the target's), peagle's
# `position_{p}_acc` (depth p of one parallel pass right).
_POSITION_ACCURACY = re.compile(r"^(?:full_acc_(\d+)|position_(\d+)_acc)_epoch$")


def position_accuracies(split_metrics: dict) -> dict[int, float]:
    """{draft position: accuracy} of one epoch's train or val metrics, for any algorithm."""
    found = {}
    for key, value in split_metrics.items():
        m = _POSITION_ACCURACY.match(key)
        if m:
            found[int(m.group(1) or m.group(2))] = value
    return dict(sorted(found.items()))
