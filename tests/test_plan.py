"""`eaglenest plan`: reasons, GPU order and hidden-state estimate, on a temp copy of the workflow.

The dry runs are real `snakemake -n` runs on the default config (and the Kimi-K2.5 config) in a
copy of the workflow, offline; the only job actually run is prepare_prompts (no engine), to
give Snakemake metadata to compare params against.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from conftest import job_timeline

from eaglenest import cli
from eaglenest.pipeline.job_events import HEARTBEAT_S, event_files, read_events
from eaglenest.pipeline.job_order import gpu_stages
from eaglenest.pipeline.rerun_reasons import CODE, MISSING, PARAMS, STALE, UPSTREAM, classify_reason
from eaglenest.planning.plan import dry_run, format_plan, make_plan
from eaglenest.planning.run_estimate import estimate_hidden_states

REPO = Path(__file__).resolve().parents[1]
GPU_ORDER = ["regenerate_responses", "extract_hidden_states", "train_draft", "evaluate_acceptance"]


def _copy_workflow(dst: Path) -> Path:
    for name in ("Snakefile",):
        shutil.copy2(REPO / name, dst / name)
    for name in (
        "rules",
        "config",
        "scripts",
        "report",
        "data/prompts",
        "data/tiny_target",
        "profiles/default",
    ):
        shutil.copytree(REPO / name, dst / name)
    return dst


@pytest.fixture(scope="module")
def workflow(tmp_path_factory) -> Path:
    return _copy_workflow(tmp_path_factory.mktemp("wf"))


# --------------------------------------------------------------------------------------------
# Reasons and the dry-run text


def test_classify_missing_and_upstream():
    r = classify_reason(
        "Missing output files: a/x.json; Input files updated by another job: a/b.jsonl, a/c.json"
    )
    assert r == [(MISSING, "a/x.json"), (UPSTREAM, "a/b.jsonl, a/c.json")]


def test_classify_code_hash_change_is_changed_code_not_params():
    r = classify_reason(
        "Params have changed since last execution: Union of exclusive params "
        "before and now across all output: before: '4d7df3ae77ab0137' now: "
        "'56eec4d6ac4e944b' "
    )
    assert [c for c, _ in r] == [CODE]


def test_classify_params_and_code_together_and_stale_input():
    r = classify_reason(
        "Updated input files: data/p.jsonl; Params have changed since last "
        "execution: Union of exclusive params before and now across all output: "
        "before: 16,'aaaaaaaaaaaaaaaa' now: 8,'bbbbbbbbbbbbbbbb' "
    )
    cats = dict(r)
    assert list(cats) == [STALE, CODE, PARAMS]
    assert cats[STALE] == "data/p.jsonl"
    assert "16" in cats[PARAMS] and "8" in cats[PARAMS]


# A toy workflow shaped like the pipeline's GPU path: regeneration (GPU), tokenize (CPU), one
# extraction shard (GPU, a wildcard) that fails. Snakemake announces its jobs in its own order.
TOY_SNAKEFILE = """\
rule all:
    input: "r/shard_1"

rule regenerate:
    output: "r/responses.jsonl"
    resources: gpu=8
    shell: "sleep 1; echo x > {output}"

rule tokenize:
    input: "r/responses.jsonl"
    output: "r/tok.jsonl", "r/meta.json"
    shell: "touch {output}"

rule extract:
    input: "r/tok.jsonl"
    output: "r/shard_{k}"
    resources: gpu=8
    shell: "exit 3"
"""


@pytest.fixture
def toy(tmp_path) -> Path:
    (tmp_path / "Snakefile").write_text(TOY_SNAKEFILE)
    return tmp_path


def _run_toy(toy: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", "--resources", "gpu=8"]
    return subprocess.run(
        [*cmd, "--logger", "eaglenest-jobs", *args], cwd=toy, capture_output=True, text=True
    )


def test_dry_run_jobs_and_gpu_order_follow_dependencies(toy):
    jobs = dry_run([], cwd=toy)
    by_rule = {j.rule: j for j in jobs}
    assert sorted(by_rule) == ["extract", "regenerate", "tokenize"]  # `all` left out
    assert [by_rule[r].gpu for r in ("regenerate", "tokenize", "extract")] == [True, False, True]
    assert by_rule["extract"].wildcards == {"k": "1"}
    assert by_rule["tokenize"].outputs == ["r/tok.jsonl", "r/meta.json"]
    assert by_rule["tokenize"].reasons[0][0] == MISSING
    order = gpu_stages(jobs)
    assert [s["rule"] for s in order] == ["regenerate", "extract"]
    assert order[1]["waits_on_cpu"] == ["tokenize"]
    assert not (toy / "r").exists() and not event_files(toy)  # a dry run leaves nothing


def test_job_events_of_a_run_record_ends_failures_and_resources(toy):
    """A real run through the logger plugin: the events file sits beside Snakemake's log and
    says which jobs finished, which failed and when."""
    proc = _run_toy(toy)
    assert proc.returncode != 0
    (events,) = event_files(toy)
    (snakemake_log,) = (toy / ".snakemake" / "log").glob("*.snakemake.log")
    assert events.name == snakemake_log.name.replace(".log", ".jobs.jsonl")
    inv = read_events(events)
    assert inv.end is not None and inv.failed and not inv.dry_run
    jobs = {j.rule: j for j in inv.jobs}
    regen, tok, ext = jobs["regenerate"], jobs["tokenize"], jobs["extract"]
    assert regen.status == tok.status == "finished" and ext.status == "failed"
    assert inv.start <= regen.start < regen.end <= tok.start < tok.end <= ext.start <= ext.end <= inv.end
    assert regen.end - regen.start >= 1.0  # exact times, not whole seconds of log text
    assert ext.resources["gpu"] == 8 and ext.wildcards == {"k": "1"} and ext.gpu and not tok.gpu
    timeline = {j["rule"]: j for j in job_timeline(events)}  # `all` never started
    assert {r: j["end"] is None for r, j in timeline.items()} == {
        "regenerate": False,
        "tokenize": False,
        "extract": True,  # failed
    }


def test_job_events_of_a_killed_run_have_no_end_and_their_heartbeat_dates_the_kill(toy):
    (toy / "Snakefile").write_text(TOY_SNAKEFILE.replace("sleep 1", "sleep 60"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--cores", "1", "--logger", "eaglenest-jobs"],
        cwd=toy,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10 * HEARTBEAT_S  # a guard: the first heartbeat is due at HEARTBEAT_S
    while not (event_files(toy) and '"alive"' in event_files(toy)[0].read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, "no heartbeat while the job ran"
        time.sleep(0.2)
    os.killpg(proc.pid, 9)
    killed_at = time.time()
    proc.wait()
    (events,) = event_files(toy)
    inv = read_events(events)
    assert inv.end is None
    (regen,) = inv.jobs
    assert regen.rule == "regenerate" and regen.status == "running" and regen.end is None
    # The run's last line is a heartbeat and dates it: the kill came after it, within the bound
    # read_events documents (one heartbeat; two here, for a loaded machine).
    last = json.loads(events.read_text().splitlines()[-1])
    assert last["event"] == "alive" and inv.last_seen == last["time"]
    assert regen.start < inv.last_seen <= killed_at < inv.last_seen + 2 * HEARTBEAT_S


# --------------------------------------------------------------------------------------------
# Real dry runs on a copy of the workflow


def test_fresh_default_plan(workflow, monkeypatch, capsys):
    plan = make_plan(cwd=workflow)  # how fast: benchmarks/bench_planning.py
    assert not (workflow / "results").exists()  # a dry run writes nothing
    rules = [s["rule"] for s in plan["stages"]]
    assert set(rules) >= {
        "build_tiny_target",
        "prepare_prompts",
        "draft_config",
        "regenerate_responses",
        "tokenize",
        "build_vocab_mapping",
        "plan_hidden_states",
        "extract_hidden_states",
        "train_draft",
        "export_draft",
        "evaluate_acceptance",
    }
    assert rules.index("tokenize") < rules.index("extract_hidden_states") < rules.index("train_draft")
    assert all(s["why"] == MISSING for s in plan["stages"])
    assert [s["rule"] for s in plan["gpu_order"]] == GPU_ORDER
    assert plan["gpu_order"][1]["jobs"] == 4
    assert plan["gpu_order"][1]["waits_on_cpu"] == ["tokenize", "plan_hidden_states"]
    assert plan["gpu_order"][3]["waits_on_cpu"] == ["export_draft"]

    hs = plan["hidden_states"]
    lines = sum(1 for ln in (REPO / "data/prompts/default.jsonl").read_text().splitlines() if ln.strip())
    held_out = yaml.safe_load((REPO / "config/config.yaml").read_text())["prompts"]["eval_samples"]
    assert hs["samples"] == lines - held_out and hs["tokens_per_sample"] == 512
    assert hs["hidden_size"] == 128 and hs["dtype_bytes"] == 2
    assert hs["bytes"] == (lines - held_out) * 512 * 4 * 128 * 2

    monkeypatch.chdir(workflow)
    assert cli.main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "GPU rules in run order:" in out and "extract_hidden_states x4" in out
    assert "regenerate_responses [GPU]" in out and "missing output" in out


def test_kimi_plan_is_offline_and_estimates_from_config(workflow, monkeypatch, capsys):
    monkeypatch.chdir(workflow)
    assert cli.main(["plan", "--configfile", "config/kimi-k2.5.yaml", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["run_dir"] == "results/kimi-k2.5"
    assert "build_tiny_target" not in [s["rule"] for s in plan["stages"]]
    assert [s["rule"] for s in plan["gpu_order"]] == GPU_ORDER
    assert plan["gpu_order"][1]["jobs"] == 100
    hs = plan["hidden_states"]
    cfg = yaml.safe_load((workflow / "config" / "kimi-k2.5.yaml").read_text())
    samples = sum(s["samples"] for s in cfg["prompts"]["sources"]) - cfg["prompts"]["eval_samples"]
    assert (hs["samples"], hs["tokens_per_sample"], hs["hidden_size"]) == (samples, 2000, 7168)
    assert hs["bytes"] == samples * 2000 * 4 * 7168 * 2
    assert hs["basis"].startswith("estimate")
    # The seed case exports to SGLang too, and the plan says what that changes in training.
    assert plan["exports"] == ["vllm", "sglang"]
    assert "export_draft_sglang" in [s["rule"] for s in plan["stages"]]
    assert "norm_before_residual false" in format_plan(plan)


def test_changed_params_and_stale_input_after_a_real_stage(workflow, tmp_path):
    # Run the one cheap stage for real, so Snakemake has metadata and outputs to compare with.
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "results/default/prompts/prompts.jsonl", "--cores", "1"],
        cwd=workflow,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = make_plan(cwd=workflow)
    stages = {s["rule"]: s for s in plan["stages"]}
    assert "prepare_prompts" not in stages  # up to date
    assert stages["regenerate_responses"]["why"] == MISSING
    # The estimate now counts the prompts that were actually kept.
    stats = json.loads((workflow / "results/default/prompts/prompts_stats.json").read_text())
    assert plan["hidden_states"]["samples"] == stats["train"]

    # A changed param: named, with the values before and now.
    cfg = yaml.safe_load((workflow / "config/config.yaml").read_text())
    before = cfg["prompts"]["eval_samples"]
    cfg["prompts"]["eval_samples"] = 8
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(cfg))
    plan = make_plan(cwd=workflow, configfiles=[str(changed)])
    stages = {s["rule"]: s for s in plan["stages"]}
    prep = stages["prepare_prompts"]
    assert prep["why"] == PARAMS and list(prep["reasons"]) == [PARAMS]
    assert f"before: {before}" in prep["details"][PARAMS] and "now: 8" in prep["details"][PARAMS]
    assert "prepare_prompts" in stages["regenerate_responses"]["upstream"]
    # prepare_prompts will rerun, so its stats no longer count: back to the config estimate.
    assert plan["hidden_states"]["basis"].startswith("estimate: samples from config")

    # A repository file's time alone (a fresh clone's checkout) reruns nothing; its content does,
    # named by the file (its sha256 is a param: rules/common.smk, repository_file).
    prompts = workflow / "data/prompts/default.jsonl"
    os.utime(prompts)
    assert "prepare_prompts" not in {s["rule"] for s in make_plan(cwd=workflow)["stages"]}
    with open(prompts, "a") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "One more prompt?"}]}) + "\n")
    plan = make_plan(cwd=workflow)
    prep = {s["rule"]: s for s in plan["stages"]}["prepare_prompts"]
    assert prep["why"] == PARAMS and "data/prompts/default.jsonl" in prep["details"][PARAMS]

    # A user's own prompt file keeps Snakemake's time rule: edited, its input is stale.
    own = workflow / "my_prompts.jsonl"
    own.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"Mine {i}?"}]}) + "\n" for i in range(4)
        )
    )
    cfg = yaml.safe_load((workflow / "config/config.yaml").read_text())
    cfg["prompts"]["sources"] = [{"name": "mine", "type": "jsonl", "path": "my_prompts.jsonl"}]
    cfg["prompts"]["eval_samples"] = 1
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump(cfg))
    subprocess.run(
        [sys.executable, "-m", "snakemake", "results/default/prompts/prompts.jsonl", "--cores", "1", "--configfile", str(mine)],
        cwd=workflow, env=env, capture_output=True, check=True,
    )  # fmt: skip
    with open(own, "a") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "And this?"}]}) + "\n")
    # Edited after the stage wrote its outputs (set, not slept for: a coarse file clock could
    # give both the same time).
    written = max(f.stat().st_mtime for f in (workflow / "results/default/prompts").iterdir())
    os.utime(own, (written + 1, written + 1))
    prep = {s["rule"]: s for s in make_plan(cwd=workflow, configfiles=[str(mine)])["stages"]}[
        "prepare_prompts"
    ]
    assert prep["why"] == STALE and "my_prompts.jsonl" in prep["details"][STALE]


def test_estimate_uses_measured_tokens_when_tokenized_data_stays(tmp_path):
    run = tmp_path / "results/x"
    (run / "tokenized").mkdir(parents=True)
    (run / "tokenized/metadata.json").write_text(json.dumps({"tokens_total": 1000, "samples_out": 7}))
    cfg = {
        "run_dir": "results/x",
        "target": {"path": "org/model", "hidden_size": 64},
        "hidden_states": {"dtype": "float32", "num_shards": 2},
        "prompts": {"sources": [{"name": "h", "type": "hf"}], "eval_samples": 1},
    }
    hs = estimate_hidden_states(cfg, tmp_path)
    assert hs["bytes"] == 1000 * 4 * 64 * 4 and hs["basis"].startswith("measured")
    hs = estimate_hidden_states(cfg, tmp_path, rebuilding={"tokenize"})
    assert hs["bytes"] is None and "samples" in hs["basis"]  # an hf source without a size


def test_kimi_plan_states_cache_status_and_gpu_memory(workflow, monkeypatch, capsys, tmp_path):
    """Offline, the plan says whether the hub id is cached (and what a download would be),
    whether its weights fit the GPUs, and the engine fallback to try on a GPU."""
    import huggingface_hub.constants as constants

    from eaglenest.target.resolve import publish_to_hub_cache

    empty = tmp_path / "empty-hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(empty))
    monkeypatch.setenv("HF_HUB_CACHE", str(empty))  # the dry run's snakemake process
    monkeypatch.chdir(workflow)
    kimi = ["plan", "--configfile", "config/kimi-k2.5.yaml"]
    assert cli.main(kimi) == 0
    out = capsys.readouterr().out
    assert f"Target: moonshotai/Kimi-K2.5: NOT in the hub cache {empty}" in out
    assert "download_target will fetch it, about 595.00 GB (target.weights_gb)" in out
    assert "74.38 GB of weights per GPU at tensor parallel 8" in out
    assert "fits the configured 141.00 GB GPUs" in out
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in out
    assert "  download_target " in out
    # Planned offline with an empty cache, as before; the plan says where the run will stop.
    assert "remote code: NOT pinned (target.revision: null): download_target will stop before fetching" in out
    assert re.search(r"free in the hub cache: .*; needed with the disk margin: 795.00 GB", out)

    assert cli.main([*kimi, "--config", "gpu_memory_gb=80"]) == 0
    assert "DOES NOT FIT the configured 80.00 GB GPUs" in capsys.readouterr().out

    # The same id once it is in the cache: its commit and size, and nothing to download.
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "kimi_k25",
                "text_config": {"vocab_size": 163840, "hidden_size": 7168, "num_hidden_layers": 61},
            }
        )
    )
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    cache = tmp_path / "hub"
    commit = publish_to_hub_cache(model, "moonshotai/Kimi-K2.5", cache)
    # Its remote code would follow main: refused at planning, with the commit to pin.
    assert cli.main([*kimi, "--config", f"target={{cache_dir: {cache}}}"]) == 1
    err = capsys.readouterr().err
    assert f"set target.revision: {commit} in {workflow / 'config' / 'kimi-k2.5.yaml'}" in err
    assert cli.main([*kimi, "--config", f"target={{cache_dir: {cache}, revision: {commit}}}"]) == 0
    out = capsys.readouterr().out
    assert (
        f"Target: moonshotai/Kimi-K2.5 (revision {commit}): cached in {cache} at commit {commit[:12]}" in out
    )
    assert f"remote code: pinned to commit {commit}" in out
    assert "download_target" not in out


def test_a_built_llama_target_is_a_folder_even_where_its_path_looks_like_a_hub_id(workflow, tmp_path):
    """`run/target` has the shape of 'org/name': the tiny Llama is still built into that folder
    (and the Kimi miniature, which is published into the hub cache, needs a real hub id)."""
    cfg = yaml.safe_load((workflow / "config" / "config.yaml").read_text())
    cfg["run_dir"], cfg["target"]["path"] = "run", "run/target"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--configfile", str(config)],
        cwd=workflow,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "output: run/target/config.json" in proc.stdout
    assert "models--" not in proc.stdout

    cfg["target"]["build_tiny"]["architecture"] = "kimi_k25"
    cfg["target"]["path"] = "run/models/kimi"
    config.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--configfile", str(config)],
        cwd=workflow,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert (
        "run/models/kimi: the kimi_k25 miniature is published into the hub cache" in proc.stdout + proc.stderr
    )


def test_config_entries_mean_what_they_mean_to_snakemake():
    """`eaglenest plan --config` parses values as Snakemake does (`true` stays a string there,
    as the workflow will see it), and a malformed entry is a clear error."""
    from snakemake.cli import parse_config

    from eaglenest.core.errors import EaglenestError
    from eaglenest.pipeline.run_config import parse_config_entries

    entries = ["gpus=8", "lr=0.5", "flag=true", "Flag=True", "ids=[1, 2]", "name=x"]
    assert parse_config_entries(entries) == parse_config(entries)
    assert parse_config_entries(["flag=true"]) == {"flag": "true"}
    with pytest.raises(EaglenestError, match="--config"):
        parse_config_entries(["no_equals_sign"])


@pytest.mark.parametrize(
    ("flags", "serves"),
    [({"avx2", "avx512f"}, "float32"), ({"avx2", "avx512_bf16"}, "bfloat16"), ({"amx_bf16"}, "bfloat16")],
)
def test_auto_dtype_follows_the_cpus_bfloat16_and_the_plan_says_why(
    workflow, monkeypatch, capsys, flags, serves
):
    """config/smollm2.yaml serves in `auto`: on a CPU without native bfloat16 (an AVX2 EPYC) it
    serves in float32 unasked, where bfloat16 is native in bfloat16; an explicit dtype stays."""
    from eaglenest.engine import dtypes

    monkeypatch.setattr(dtypes, "cpu_flags", lambda cpuinfo=dtypes.CPUINFO: set(flags))
    monkeypatch.setattr(dtypes, "has_gpu", lambda: False)
    monkeypatch.chdir(workflow)
    assert cli.main(["plan", "--configfile", "config/smollm2.yaml", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["dtypes"]["vllm"] == serves
    assert plan["dtypes"]["train"] == "float32"  # configured so: kept
    assert "vllm.dtype " + serves + " (auto on a CPU" in plan["dtypes"]["reason"]
    assert "train.dtype float32 (as configured)" in plan["dtypes"]["reason"]
    assert f"Dtypes: vllm.dtype {serves} (auto on a CPU" in format_plan(plan)


@pytest.mark.parametrize(
    ("flags", "serves", "trains"),
    [
        ({"avx2"}, "float32", "float32"),
        ({"avx2", "avx512_bf16"}, "bfloat16", "float32"),  # measured: autocast no faster there
        ({"avx512_bf16", "amx_tile", "amx_bf16"}, "bfloat16", "bfloat16"),
    ],
)
def test_auto_trains_in_bfloat16_only_with_the_cpus_matrix_units(flags, serves, trains):
    from eaglenest.engine.dtypes import choose_dtypes

    chosen = choose_dtypes("auto", "auto", "cpu", flags)
    assert (chosen["vllm"], chosen["train"]) == (serves, trains)
    assert f"train.dtype {trains} (auto on a CPU" in chosen["reason"]
    if serves == "bfloat16" and trains == "float32":
        assert "without amx_bf16 matrix units" in chosen["reason"]


def test_an_explicit_dtype_is_kept_and_a_gpu_serves_in_the_models_own():
    from eaglenest.engine.dtypes import choose_dtypes

    assert choose_dtypes("bfloat16", "bfloat16", "cpu", {"avx2"})["vllm"] == "bfloat16"
    gpu = choose_dtypes("auto", "auto", "cuda", set())
    assert (gpu["vllm"], gpu["train"]) == ("auto", "bfloat16")
