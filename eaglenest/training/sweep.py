"""Sweeps: several drafts trained on one run's shared data (the report that compares them is
eaglenest.report.variant_comparison, so training does not depend on plotting code).

The config's `sweep:` section lists values for draft-side settings. Each combination is a
variant with a readable name (`frac0.25-vocab512`) whose vocabulary mapping, draft config,
training, export and evaluation live under `<run_dir>/variants/<name>/`; prompts, responses,
tokenized rows and hidden states are the run's own, built once. The variant whose settings are
the config's own is the run's draft itself (the base), never trained twice.

`data_fraction` trains on a seeded, nested subset of the training rows (a row in the 25% subset
is in the 50% one) and keeps speculators' validation rows whole, so every variant's validation
estimate is taken on the same rows. `sources` trains on the training rows of some prompt
sources only (which part of the data pays), with the same validation rows; with
`data_fraction` the fraction is of those sources' rows.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from dataclasses import dataclass, field

from eaglenest.core.errors import EaglenestError
from eaglenest.draft.algorithms import TRAIN_OVERRIDES, algorithm_settings, algorithm_train_value

log = logging.getLogger(__name__)

# sweep key -> (its tag in variant names, where the config keeps the run's own value)
SETTINGS = {
    "data_fraction": ("frac", None),
    "sources": ("src", None),
    "draft_vocab_size": ("vocab", ("vocab", "draft_vocab_size")),
    "ttt_steps": ("ttt", ("train", "ttt_steps")),
    "draft_layers": ("layers", ("train", "draft_layers")),
    "epochs": ("epochs", ("train", "epochs")),
    "lr": ("lr", ("train", "lr")),
    "algorithm": ("", ("draft", "algorithm")),  # its values name themselves: frac0.5-p_eagle
}
COMBINE = ("grid", "one_at_a_time")
# Settings whose values span orders of magnitude are drawn on a log axis.
LOG_AXES = {"data_fraction", "draft_vocab_size", "lr"}
# The run's own value of the settings of the data, which the config has no key for: all rows.
DATA_DEFAULTS = {"data_fraction": 1.0, "sources": "all"}
SOURCES_JOIN = "+"  # a `sources` value is held as its names joined, so that it names and sorts


@dataclass(frozen=True)
class Variant:
    name: str
    settings: dict = field(hash=False)  # every SETTINGS key, swept or not
    is_base: bool = False


def base_settings(config: dict) -> dict:
    """The run's own value of each sweepable setting (data_fraction: all rows; lr and
    draft_layers: what its own draft trains with, which may be its algorithm's own)."""
    settings = {
        key: DATA_DEFAULTS[key] if where is None else config[where[0]][where[1]]
        for key, (_, where) in SETTINGS.items()
    }
    return with_algorithm_overrides(config, settings, swept=())


def with_algorithm_overrides(config: dict, settings: dict, swept) -> dict:
    """`settings` with each train override (lr, draft_layers) that is not in `swept` set to the
    value its algorithm trains with: a swept value trains every algorithm, an unswept one is
    each algorithm's own, so a DFlash variant beside an EAGLE-3 run keeps DFlash's rate."""
    resolved = dict(settings)
    for key in TRAIN_OVERRIDES:
        if key not in swept:
            resolved[key] = algorithm_train_value(config, settings["algorithm"], key)
    return resolved


def swept_keys(sweep: dict | None) -> list[str]:
    return [k for k in SETTINGS if (sweep or {}).get(k)]


def format_setting(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def variant_name(settings: dict, keys: list[str]) -> str:
    return "-".join(f"{SETTINGS[k][0]}{format_setting(settings[k])}" for k in keys)


def plan_variants(config: dict) -> list[Variant]:
    """The base first, then each variant of the config's `sweep:` in the order its lists give
    them; [] without a sweep. `combine: grid` (the default) takes every combination of the lists;
    `one_at_a_time` varies each setting alone, the others at the run's own values."""
    sweep = config.get("sweep")
    if not sweep:
        return []
    keys = swept_keys(sweep)
    if not keys:
        raise EaglenestError(f"sweep: lists no setting to vary (any of {', '.join(SETTINGS)})")
    combine = sweep.get("combine", "grid")
    if sweep.get("sources"):
        sweep = {**sweep, "sources": swept_sources(config, sweep["sources"])}
    base = base_settings(config)
    if combine == "grid":
        combos = [
            dict(zip(keys, values, strict=True)) for values in itertools.product(*(sweep[k] for k in keys))
        ]
    else:
        combos = [{k: v} for k in keys for v in sweep[k]]
    fractions = sweep.get("data_fraction") or []
    if config["hidden_states"]["mode"] == "hybrid" and (
        any(f < 1 for f in fractions) or sweep.get("sources")
    ):
        raise EaglenestError(
            "sweep: data_fraction below 1, or sources, needs hidden_states.mode offline or online: "
            "hybrid mode keeps one folder of extracted samples per run, numbered by training row, "
            "which subsets of the rows would overwrite"
        )
    variants = [Variant(variant_name(base, keys), base, is_base=True)]
    seen = {variant_name(base, keys)}
    for combo in combos:
        settings = with_algorithm_overrides(config, {**base, **combo}, swept=combo)
        name = variant_name(settings, keys)
        if name not in seen:
            seen.add(name)
            variants.append(Variant(name, settings))
    return variants


def swept_sources(config: dict, values) -> list[str]:
    """`sweep.sources` (lists of prompt-source names) as the values variants hold: each list's
    names, in the config's source order, joined; a name the config's prompts lack is refused."""
    names = [s["name"] for s in config["prompts"]["sources"]]
    out = []
    for value in values:
        if not isinstance(value, list) or not value or not all(isinstance(n, str) for n in value):
            raise EaglenestError(
                f"sweep: each sources value must be a non-empty list of source names, got {value!r}"
            )
        unknown = [n for n in value if n not in names]
        if unknown:
            raise EaglenestError(
                f"sweep: sources {value} names no prompt source {', '.join(map(repr, unknown))} "
                f"(prompts.sources: {', '.join(names)})"
            )
        odd = [n for n in value if SOURCES_JOIN in n or n == DATA_DEFAULTS["sources"]]
        if odd:
            raise EaglenestError(
                f"sweep: a swept source's name may not contain {SOURCES_JOIN!r} or be "
                f"{DATA_DEFAULTS['sources']!r}: {', '.join(odd)}"
            )
        out.append(SOURCES_JOIN.join(n for n in names if n in value))
    return out


def train_settings(config: dict, algorithm: str | None = None) -> dict:
    """The `train` params of the run: the config's section, and the draft's form for the engines
    it is exported for (SGLang's forward keeps the unnormalised state as the first layer's
    residual, so a draft exported to it trains with norm_before_residual false; only then is the
    key added, so a vLLM-only run's training spec stays what it was). `algorithm` (the run's
    draft.algorithm when None): a drafter other than eagle3 adds its own settings, under its
    name, so an EAGLE-3 spec stays what it was too, and trains at its own lr and depth where
    it has them."""
    hp = dict(config["train"])
    if "sglang" in config["export"]["engines"]:
        hp["norm_before_residual"] = False
    algorithm = algorithm or config["draft"]["algorithm"]
    for key in TRAIN_OVERRIDES:
        hp[key] = algorithm_train_value(config, algorithm, key)
    if algorithm != "eagle3":
        hp[algorithm] = algorithm_settings(config, algorithm)
    return hp


def train_hp(config: dict, settings: dict) -> dict:
    """The `train` params of a variant: the run's own, with the variant's settings (whose lr and
    draft_layers plan_variants resolved: swept, or the variant's algorithm's own)."""
    hp = train_settings(config, settings["algorithm"])
    for key in ("ttt_steps", "draft_layers", "epochs", "lr"):
        hp[key] = settings[key]
    hp["data_fraction"] = settings["data_fraction"]
    if settings["sources"] != DATA_DEFAULTS["sources"]:  # absent otherwise: specs stay as they were
        hp["sources"] = settings["sources"].split(SOURCES_JOIN)
    return hp


def _unit_hash(seed: int, row: int) -> float:
    digest = hashlib.blake2b(f"{seed}:{row}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def training_subset(
    num_rows: int, train_data_ratio: float, fraction: float, seed: int, source=None, eligible=None
):
    """The rows a `fraction` of the training data trains on, and the trainer's
    `train_data_ratio` over them. speculators holds out the rows from int(n * ratio) on for
    validation: they stay, so validation compares across fractions. A training row is kept when
    it is `eligible` (a predicate on its index; None: every row, else a sweep's `sources`) and its
    seeded hash is below `fraction`, which nests the subsets (25% inside 50%)."""
    split = int(num_rows * train_data_ratio)
    kept = [i for i in range(split) if (eligible is None or eligible(i)) and _unit_hash(seed, i) < fraction]
    if not kept:
        raise EaglenestError(
            f"data_fraction {fraction} keeps none of the {split} training rows"
            + (" of the swept sources" if eligible is not None else "")
            + ": raise it",
            source,
        )
    rows = kept + list(range(split, num_rows))
    # speculators splits at int(len * ratio): half a row of slack makes that land on len(kept).
    ratio = (len(kept) + 0.5) / len(rows) if len(rows) > len(kept) else 1.0
    return rows, ratio
