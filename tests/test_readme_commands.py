"""The README's commands as a user types them, from the root of a fresh clone, on the shipped
config files: a config file given with --configfile is the whole config, the embedded default
applies only without one, and the stand-in builder never writes into a folder it did not make.

The miniature's own run, `snakemake --cores all --configfile config/kimi-mini.yaml` from a
fresh clone's root (its first job builds the target), is the `kimi_mini_run` fixture that
tests/test_kimi_mini_pipeline.py reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import folder_bytes, fresh_clone, planned_jobs, snakemake, users_model, write_config

from eaglenest.pipeline.run_config import load_config
from eaglenest.target.resolve import publish_to_hub_cache, repo_cache_folder

# The files build_tiny_target declares as outputs (rules/common.smk, TARGET_FILES): Snakemake
# deletes them before the job runs.
BUILDER_OUTPUTS = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    return fresh_clone(tmp_path_factory.mktemp("clone"))


def shipped(clone: Path, name: str) -> dict:
    return yaml.safe_load((clone / "config" / name).read_text())


def test_no_configfile_plans_the_embedded_default(clone):
    """`snakemake -n` and `eaglenest plan` with no arguments: the default config, whole."""
    jobs = planned_jobs(snakemake(clone, None, "-n"))
    assert jobs["build_tiny_target"] == 1 and jobs["all"] == 1
    assert load_config(clone, clone / "Snakefile", cwd=clone) == shipped(clone, "config.yaml")
    # --config alone overrides keys of the default, as Snakemake's --config does.
    cfg = load_config(clone, clone / "Snakefile", config_entries=["run_dir=results/other"], cwd=clone)
    assert cfg == {**shipped(clone, "config.yaml"), "run_dir": "results/other"}


@pytest.mark.parametrize("name", ["kimi-mini.yaml", "kimi-k2.5.yaml"])
def test_a_shipped_configfile_is_read_whole_and_alone(clone, name):
    """What `eaglenest plan --configfile config/NAME` reads is that file, nothing of the
    default's (the default's build_tiny.intermediate_size broke the miniature's build)."""
    assert load_config(clone, clone / "Snakefile", [f"config/{name}"], cwd=clone) == shipped(clone, name)
    jobs = planned_jobs(snakemake(clone, clone / "config" / name, "-n"))
    assert jobs["all"] == 1


def test_several_configfiles_merge_in_order_and_without_the_default(clone):
    overlay = write_config(clone, {"vocab": {"draft_vocab_size": 256}}, "overlay.yaml")
    cfg = load_config(clone, clone / "Snakefile", ["config/kimi-mini.yaml", overlay.name], cwd=clone)
    expected = shipped(clone, "kimi-mini.yaml")
    expected["vocab"]["draft_vocab_size"] = 256
    assert cfg == expected


def test_a_configfile_missing_a_required_section_is_refused_naming_the_file(clone):
    cfg = shipped(clone, "config.yaml")
    del cfg["evaluate"]
    configfile = write_config(clone, cfg, "no-evaluate.yaml")
    proc = snakemake(clone, configfile, "-n", check=False)
    assert proc.returncode != 0
    assert f"config {configfile} does not match the schema" in proc.stdout + proc.stderr
    assert "'evaluate' is a required property" in proc.stdout + proc.stderr


def test_a_local_model_without_build_tiny_plans_no_build_into_it(clone, untrained_target, tmp_path):
    """A config for one's own model names its folder and says nothing of build_tiny."""
    model = users_model(untrained_target, tmp_path / "SmolLM2-135M-Instruct")
    cfg = shipped(clone, "config.yaml")
    cfg["target"] = {"path": str(model), "name": "my-model"}
    configfile = write_config(clone, cfg, "my-model.yaml")
    before = folder_bytes(model)
    jobs = planned_jobs(snakemake(clone, configfile, "-n"))
    assert "build_tiny_target" not in jobs and jobs["resolve_target"] == 1
    assert folder_bytes(model) == before


def test_an_sglang_export_sglang_could_not_feed_is_refused_before_any_job(clone, untrained_target, tmp_path):
    """A local target whose architecture SGLang's EAGLE-3 capture does not know (or aux layers it
    cannot capture) fails `snakemake -n`, naming its config.json, not after training."""
    model = users_model(untrained_target, tmp_path / "my-mistral")
    config_json = model / "config.json"
    config_json.write_text(config_json.read_text().replace('"LlamaForCausalLM"', '"MistralForCausalLM"'))
    cfg = shipped(clone, "config.yaml")
    cfg["target"] = {"path": str(model), "name": "my-mistral"}
    cfg["export"] = {"engines": ["vllm", "sglang"]}
    proc = snakemake(clone, write_config(clone, cfg, "mistral-sglang.yaml"), "-n", check=False)
    assert proc.returncode != 0 and not proc.events.exists()
    out = proc.stdout + proc.stderr
    assert f"export.engines: {config_json}: sglang" in out and "MistralForCausalLM" in out
    cfg["export"] = {"engines": ["vllm"]}  # the same model, exported for vLLM alone, plans
    assert planned_jobs(snakemake(clone, write_config(clone, cfg, "mistral-vllm.yaml"), "-n"))["all"] == 1


def test_build_tiny_set_on_a_users_folder_by_mistake_is_refused_and_nothing_deleted(
    clone, untrained_target, tmp_path
):
    model = users_model(untrained_target, tmp_path / "my-model")
    assert all((model / name).exists() for name in BUILDER_OUTPUTS)  # what the job would delete
    cfg = shipped(clone, "config.yaml")
    cfg["target"]["path"] = str(model)  # build_tiny stays, as in the default
    cfg["run_dir"] = "results/mistake"
    configfile = write_config(clone, cfg, "mistake.yaml")
    before = folder_bytes(model)
    for args in (["-n"], ["--cores", "2"]):
        proc = snakemake(clone, configfile, *args, check=False)
        assert proc.returncode != 0, args
        assert (
            f"config {configfile}: target.path: {model}: target.build_tiny would replace this folder"
            in proc.stdout + proc.stderr
        )
        assert "nothing was deleted" in proc.stdout + proc.stderr
        assert folder_bytes(model) == before
    assert not (clone / "results" / "mistake").exists()


def test_the_miniature_is_not_published_over_a_cached_model_it_did_not_build(
    clone, untrained_target, tmp_path
):
    """The miniature's hub id and cache naming a model the hub client downloaded there."""
    cache = tmp_path / "hub"
    cfg = shipped(clone, "kimi-mini.yaml")
    cfg["target"]["cache_dir"] = str(cache)
    publish_to_hub_cache(users_model(untrained_target, tmp_path / "download"), cfg["target"]["path"], cache)
    repo = repo_cache_folder(cfg["target"]["path"], cache)
    before = folder_bytes(repo)
    proc = snakemake(clone, write_config(clone, cfg, "kimi-own-cache.yaml"), "-n", check=False)
    assert proc.returncode != 0
    assert f"{repo}: target.build_tiny would publish the miniature" in proc.stdout + proc.stderr
    assert folder_bytes(repo) == before
