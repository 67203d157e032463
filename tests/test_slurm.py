"""The real workflow through a real single-node SLURM with `--workflow-profile profiles/slurm`.

A cluster with 8 fake GPUs is started on localhost (tests/slurm_cluster.py) and stopped by PID
afterwards, whatever happens. Snakemake then builds, through SLURM, part of the default pipeline
on a small config: the tiny target, prompts, regenerated responses (GPU: a vLLM server started
inside the job), the draft config, tokenization, the hidden-state plan and two hidden-state
shards (GPU, transformers backend). Checked:

- every job went through sbatch (job ids in Snakemake's output, the jobs in `scontrol`), GPU
  rules on the `gpu` partition with `gres:gpu:8`, CPU rules on `cpu` without GPUs;
- the two shard jobs were submitted together (no Snakemake-side gpu cap: profiles/default was
  not read) and SLURM ran them one after the other: no two GPU jobs overlapped (start and end
  from the slurmd prolog/epilog);
- a CPU job ran beside a GPU job;
- the outputs equal those of a plain local `snakemake --cores 2` run of the same targets
  (profiles/default; run at the same time, to keep the test short).

Skips only when not root or when the SLURM packages cannot be installed.
Run: `HF_HUB_OFFLINE=1 .venv/bin/python -m pytest tests/test_slurm.py -q -s`.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from slurm_cluster import Cluster, ClusterUnavailable, ensure_installed, executor_env

pytestmark = [pytest.mark.slurm, pytest.mark.engine]

REPO = Path(__file__).resolve().parent.parent
RUN = "run"
GPU_RULES = {"regenerate_responses", "extract_hidden_states", "train_draft", "evaluate_acceptance"}
NUM_SHARDS = 2
TARGETS = [
    f"{RUN}/prompts/prompts.jsonl",
    f"{RUN}/draft_config.json",
    f"{RUN}/responses/raw_responses.jsonl",
    *[f"{RUN}/hidden_states/shard_{k}" for k in range(NUM_SHARDS)],
]
EXPECTED_RULES = {  # rule -> jobs
    "build_tiny_target": 1,
    "resolve_target": 1,
    "prepare_prompts": 1,
    "regenerate_responses": 1,
    "draft_config": 1,
    "tokenize": 1,
    "plan_hidden_states": 1,
    "extract_hidden_states": NUM_SHARDS,
}
# Guards against a hang (a status check that never ends), not timings: the suite runs this test
# beside its shared runs, on the same cores.
SLURM_LIMIT_S = 900
LOCAL_LIMIT_S = 600


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # In CI (CI set) a cluster that cannot start is a failure, not a quiet skip.
    give_up = pytest.fail if os.environ.get("CI") else pytest.skip
    if os.geteuid() != 0:
        give_up("the SLURM test needs root (it installs and runs slurmctld, slurmd, munged)")
    try:
        ensure_installed()
    except ClusterUnavailable as e:
        give_up(f"SLURM packages cannot be installed here: {e}")
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        t0 = time.monotonic()
        c.start()
        print(f"\nSLURM up in {time.monotonic() - t0:.1f} s (state {c.state})")
        yield c
    finally:
        t0 = time.monotonic()
        c.stop()
        print(f"SLURM stopped in {time.monotonic() - t0:.1f} s")


@pytest.fixture(scope="module")
def slurm_executor(tmp_path_factory) -> dict[str, str]:
    """What the SLURM run's environment adds so that Snakemake finds its SLURM executor."""
    try:
        return executor_env(tmp_path_factory.mktemp("slurm-executor"))
    except ClusterUnavailable as e:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(str(e))


@pytest.fixture
def short_tmp():
    """A short work folder: vLLM binds unix sockets under `<run_dir>/.eaglenest/tmp`, and a
    socket path may not exceed 107 characters (pytest's tmp_path is too deep for that)."""
    path = Path(tempfile.mkdtemp(prefix="ens-", dir="/tmp"))
    yield path
    if os.environ.get("EAGLENEST_SLURM_KEEP") != "1":
        shutil.rmtree(path, ignore_errors=True)
    else:
        print(f"kept {path}")


def write_config(workdir: Path) -> Path:
    """A small run derived from config/config.yaml, all of it inside `workdir`."""
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["run_dir"] = RUN
    cfg["target"]["path"] = f"{RUN}/target"
    # Scheduling is under test, not the target: a short build keeps both runs in their limits.
    cfg["target"]["build_tiny"]["pretrain_steps"] = 200
    cfg["prompts"]["eval_samples"] = 4
    cfg["prompts"]["sources"] = [{"name": "default", "type": "bundled", "samples": 24}]
    cfg["regenerate"]["max_tokens"] = 16
    cfg["hidden_states"]["num_shards"] = NUM_SHARDS
    cfg["hidden_states"]["backend"] = "transformers"  # a GPU rule that needs no vLLM server
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def base_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))
        and k not in ("EAGLENEST_WORKFLOW_PID", "SNAKEMAKE_PROFILE")
    }
    env["HF_HUB_OFFLINE"] = "1"
    return env


def snakemake(workdir: Path, args: list[str], env: dict, limit_s: int) -> tuple[str, float]:
    """Run Snakemake from the repository root on `workdir`; SIGINT on timeout (SIGTERM hangs)."""
    cmd = [
        "timeout",
        "-s",
        "INT",
        "-k",
        "60",
        str(limit_s),
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        *args,
        *TARGETS,
    ]
    t0 = time.monotonic()
    r = subprocess.run(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    wall = time.monotonic() - t0
    (workdir / "snakemake.out").write_text(r.stdout)
    if r.returncode != 0:
        logs = []
        for log in sorted((workdir / ".snakemake" / "slurm_logs").rglob("*.log")):
            logs.append(f"--- {log}\n" + "\n".join(log.read_text().splitlines()[-25:]))
        for log in sorted((workdir / RUN / "logs").rglob("*.log")):
            logs.append(f"--- {log}\n" + "\n".join(log.read_text().splitlines()[-15:]))
        pytest.fail(
            f"snakemake exited {r.returncode} after {wall:.0f} s "
            f"({'timed out, ' if r.returncode in (124, 130, 137) else ''}{' '.join(cmd)})"
            f"\n{r.stdout[-6000:]}\n" + "\n".join(logs)[-12000:]
        )
    return r.stdout, wall


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def overlap(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def test_workflow_on_slurm(cluster, slurm_executor, short_tmp):
    t_all = time.monotonic()
    slurm_dir, local_dir = short_tmp / "slurm", short_tmp / "local"
    write_config(slurm_dir)
    write_config(local_dir)

    with ThreadPoolExecutor(1) as pool:
        # The same targets locally (profiles/default, one machine), meanwhile: the SLURM run
        # spends most of its time waiting for status checks.
        local = pool.submit(snakemake, local_dir, ["--cores", "2"], base_env(), LOCAL_LIMIT_S)
        # The SLURM run: the documented command, plus a short first status check.
        out, slurm_wall = snakemake(
            slurm_dir,
            ["--workflow-profile", "profiles/slurm", "--slurm-init-seconds-before-status-checks", "2"],
            {**base_env(), **cluster.env, **slurm_executor},
            SLURM_LIMIT_S,
        )
        local_out, local_wall = local.result()
    print(f"\nSLURM run: {slurm_wall:.0f} s, local run beside it: {local_wall:.0f} s")
    assert "Using workflow specific profile profiles/slurm" in out
    assert "profiles/default" not in out, "the default profile (gpu cap) was read"
    assert "Using workflow specific profile profiles/default" in local_out

    # Every job went through sbatch.
    submitted = re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", out)
    sm_to_slurm = dict(submitted)
    jobs = {}
    for sm_id, slurm_id in submitted:
        info = cluster.show_job(slurm_id)
        rule = re.match(r"rule_(\w+?)(?:_wildcards_.*)?$", info.get("Comment", ""))
        assert rule, f"SLURM job {slurm_id}: no rule in its comment: {info}"
        jobs[slurm_id] = {"rule": rule.group(1), "sm_id": sm_id, "info": info}
    counts = {}
    for j in jobs.values():
        counts[j["rule"]] = counts.get(j["rule"], 0) + 1
    assert counts == EXPECTED_RULES, f"jobs submitted to SLURM per rule: {counts}"

    # Their resources and their run times, as SLURM saw them.
    timeline = cluster.timeline()
    for slurm_id, j in jobs.items():
        info, gpu = j["info"], j["rule"] in GPU_RULES
        j["gpu"] = gpu
        assert info["JobState"] == "COMPLETED", f"job {slurm_id} ({j['rule']}): {info}"
        assert info["Partition"] == ("gpu" if gpu else "cpu"), (j["rule"], info["Partition"])
        assert (info.get("TresPerJob") == "gres:gpu:8") == gpu, (j["rule"], info.get("TresPerJob"))
        t = timeline.get(slurm_id)
        assert t and t["start"] and t["end"], f"job {slurm_id} ({j['rule']}): no prolog/epilog"
        assert t["gpus"] == (list(range(8)) if gpu else []), (j["rule"], t["gpus"])
        j.update(start=t["start"], end=t["end"])

    t0 = min(j["start"] for j in jobs.values())
    print("job timeline through SLURM (s from the first job's start):")
    for slurm_id, j in sorted(jobs.items(), key=lambda kv: kv[1]["start"]):
        print(
            f"  {slurm_id:>3} {j['rule']:<22} {j['start'] - t0:7.1f} {j['end'] - t0:7.1f} "
            f"{'GPU x8' if j['gpu'] else 'CPU'}"
        )

    gpu_jobs = sorted((j for j in jobs.values() if j["gpu"]), key=lambda j: j["start"])
    cpu_jobs = [j for j in jobs.values() if not j["gpu"]]
    for a, b in itertools.pairwise(gpu_jobs):
        assert a["end"] <= b["start"], f"GPU jobs overlapped: {a['rule']} and {b['rule']}"
    assert any(overlap(c, g) for c in cpu_jobs for g in gpu_jobs), "no CPU job ran beside a GPU job"

    # Snakemake submitted both shards before either finished: SLURM, not a Snakemake-side gpu
    # cap, made them take turns.
    shard_sm_ids = [j["sm_id"] for j in jobs.values() if j["rule"] == "extract_hidden_states"]
    last_submit = max(out.index(f"Job {i} has been submitted") for i in shard_sm_ids)
    first_finish = min(out.index(f"Finished jobid: {i} ") for i in shard_sm_ids)
    assert last_submit < first_finish, "shard jobs were not submitted together"
    assert set(sm_to_slurm) >= set(shard_sm_ids)

    # -- the outputs equal the local run's ---------------------------------------------------
    on_slurm, local = slurm_dir / RUN, local_dir / RUN
    for rel in (
        "prompts/prompts.jsonl",
        "prompts/eval_prompts.jsonl",
        "draft_config.json",
        "target/model.safetensors",
        "target/tokenizer.json",
        "target/config.json",
    ):
        assert (on_slurm / rel).read_bytes() == (local / rel).read_bytes(), f"{rel} differs"
    # Greedy decoding on CPU: the same responses, token ids included.
    rs, rl = (read_jsonl(p / "responses" / "raw_responses.jsonl") for p in (on_slurm, local))
    assert {r["id"]: r for r in rs} == {r["id"]: r for r in rl}, "raw_responses.jsonl differs"
    same_bytes = (on_slurm / "responses/raw_responses.jsonl").read_bytes() == (
        local / "responses/raw_responses.jsonl"
    ).read_bytes()
    print(f"raw_responses.jsonl: same rows{' and same bytes' if same_bytes else ' (order differs)'}")
    for k in range(NUM_SHARDS):
        ds, dl = on_slurm / "hidden_states" / f"shard_{k}", local / "hidden_states" / f"shard_{k}"
        files = sorted(p.name for p in ds.glob("*.safetensors"))
        assert files and files == sorted(p.name for p in dl.glob("*.safetensors"))
        for name in files:
            assert (ds / name).read_bytes() == (dl / name).read_bytes(), f"shard_{k}/{name}"
        ms, ml = (json.loads((d / "manifest.json").read_text()) for d in (ds, dl))
        for m in (ms, ml):  # timings differ by nature, and which rows the sample store gave
            m.pop("seconds", None)
            m.pop("tokens_per_s", None)
            m.pop("reused_samples", None)  # (a repeated row, in whichever shard ran later)
        assert ms == ml, f"shard_{k}/manifest.json differs"
    print(f"test body: {time.monotonic() - t_all:.0f} s")
