"""Crashes mid-stage: the rerun resumes, redoes only what was unfinished, and ends complete.

Each test stops the real workflow part way through a stage, then reruns it: SIGTERM to
Snakemake alone (a preemption) during regeneration; SIGKILL to Snakemake's whole process group
(an OOM killer, a lost node) during extraction and training, rerun with `--rerun-incomplete`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (
    assert_shard_matches_transformers,
    default_config,
    planned_jobs,
    run_env,
    snakemake,
    snakemake_command,
    write_config,
)

pytestmark = pytest.mark.engine


def start_snakemake(workdir: Path, configfile: Path, *targets: str) -> subprocess.Popen:
    """The workflow started as the suite starts every run (conftest.snakemake_command), in a
    session of its own so that a kill can take its whole process group."""
    cmd, cwd, _events = snakemake_command(workdir, configfile, "--cores", "2", *targets)
    log = workdir / f"killed-run-{time.time_ns()}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=run_env(None), start_new_session=True
        )
    proc.workdir, proc.configfile, proc.log = workdir, configfile, log
    return proc


def kill_when(proc: subprocess.Popen, condition, timeout: float = 600) -> None:
    """SIGKILL the run's process group once `condition()` holds, then clear its stale lock
    (`snakemake --unlock`, as a user must after a hard kill)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                "the run ended before it could be interrupted:\n" + Path(proc.log).read_text()[-3000:]
            )
        if condition():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            snakemake(proc.workdir, proc.configfile, "--unlock")
            return
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError("condition for the interruption never came")


def wait_servers_gone(run_dir: Path, timeout: float = 60) -> None:
    """The supervisor stops the leased server once the killed workflow is gone."""
    from eaglenest.engine.server import pid_alive

    starts = run_dir / ".eaglenest" / "server" / "starts.log"
    pids = [json.loads(line)["pid"] for line in open(starts)] if starts.exists() else []
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids):
        assert time.monotonic() < deadline, "server outlived the killed workflow"
        time.sleep(0.5)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_digests(root: Path, pattern: str) -> dict[str, str]:
    return {str(p.relative_to(root)): digest(p) for p in sorted(root.glob(pattern))}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory, untrained_target):
    """A workdir with the default config on 80 prompts. Its target is the untrained tiny target
    (how a stage stops and resumes does not depend on the weights), so these tests run while
    the shared runs build, instead of after the default run's 1,200-step target build."""
    workdir = tmp_path_factory.mktemp("interrupts")
    cfg = default_config()
    cfg["target"]["path"] = str(untrained_target)
    cfg["target"]["build_tiny"] = None
    cfg["prompts"]["sources"] = [{"name": "default", "type": "bundled", "samples": 80}]
    cfg["prompts"]["eval_samples"] = 4
    cfg["regenerate"]["max_tokens"] = 96
    cfg["train"]["epochs"] = 4
    configfile = write_config(workdir, cfg)
    return {"workdir": workdir, "cfg": cfg, "configfile": configfile, "run_dir": workdir / cfg["run_dir"]}


def test_sigterm_to_the_workflow_stops_regeneration_now_and_the_rerun_sends_only_the_rest(small_run):
    """SIGTERM to Snakemake alone (a preemption, `kill PID`): Snakemake by itself would wait
    for regeneration to finish; the workflow forwards the signal, the stage stops at once,
    answered prompts stay, the server is stopped and no lock is left behind."""
    workdir, run_dir = small_run["workdir"], small_run["run_dir"]
    target = f"{small_run['cfg']['run_dir']}/responses/raw_responses.jsonl"
    progress_dir = run_dir / ".eaglenest" / "regenerate"

    def answered() -> int:
        return sum(len(p.read_text().splitlines()) for p in progress_dir.glob("progress-*.jsonl"))

    proc = start_snakemake(workdir, small_run["configfile"], target)
    deadline = time.monotonic() + 600
    while not (progress_dir.exists() and answered() >= 20):
        assert proc.poll() is None and time.monotonic() < deadline, Path(proc.log).read_text()[-3000:]
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGTERM)  # the main process only, not its group
    t0 = time.monotonic()
    assert proc.wait(timeout=120) != 0
    assert time.monotonic() - t0 < 60
    stage_log = (run_dir / "logs" / "regenerate_responses.log").read_text()
    assert "SIGTERM: stopping; finished work and progress are kept" in stage_log
    wait_servers_gone(run_dir)
    done_before = answered()
    assert done_before < 80 and not (run_dir / "responses" / "raw_responses.jsonl").exists()
    assert not any((workdir / ".snakemake" / "locks").glob("*"))  # a clean stop: no --unlock

    snakemake(workdir, small_run["configfile"], "--cores", "2", target)
    log = (run_dir / "logs" / "regenerate_responses.log").read_text()
    prompts = [json.loads(line)["id"] for line in open(run_dir / "prompts" / "prompts.jsonl")]
    sent_line = [line for line in log.splitlines() if "to send" in line][-1]
    assert f"{done_before} already answered" in sent_line
    assert f"{len(prompts) - done_before} to send" in sent_line
    rows = [json.loads(line) for line in open(run_dir / "responses" / "raw_responses.jsonl")]
    n = small_run["cfg"]["regenerate"].get("n", 1)
    # Every prompt answered once (n samples each), in prompt order, each response row unique.
    assert [r["prompt_id"] for r in rows] == [p for p in prompts for _ in range(n)]
    assert len({r["id"] for r in rows}) == len(rows)
    assert not any("error" in r for r in rows)


def test_kill_during_extraction_redoes_only_unfinished_shards_and_ends_with_every_row(small_run, tmp_path):
    workdir, run_dir, cfg = small_run["workdir"], small_run["run_dir"], small_run["cfg"]
    rd = cfg["run_dir"]
    snakemake(workdir, small_run["configfile"], "--cores", "2", f"{rd}/hidden_states/plan.json")
    num_shards = cfg["hidden_states"]["num_shards"]
    shards = [f"{rd}/hidden_states/shard_{k}" for k in range(num_shards)]

    def complete() -> list[str]:
        """Shards Snakemake has recorded as finished (a shard renamed into place an instant
        before the kill is still marked incomplete, and is rightly redone)."""
        marks = workdir / ".snakemake" / "incomplete"
        pending = {base64.b64decode(m.name).decode() for m in marks.glob("*")} if marks.exists() else set()
        return [s for s in shards if (workdir / s).is_dir() and s not in pending]

    proc = start_snakemake(workdir, small_run["configfile"], *shards)
    kill_when(proc, lambda: 1 <= len(complete()) < 3)
    wait_servers_gone(run_dir)
    finished = complete()
    assert 1 <= len(finished) < num_shards
    # A killed shard never looks complete: only renamed, validated shards carry the name.
    for name in finished:
        assert (workdir / name / "manifest.json").exists()
    kept = {name: tree_digests(workdir / name, "*") for name in finished}

    plan = snakemake(workdir, small_run["configfile"], "-n", "--rerun-incomplete", *shards)
    assert planned_jobs(plan)["extract_hidden_states"] == num_shards - len(finished)
    snakemake(workdir, small_run["configfile"], "--cores", "2", "--rerun-incomplete", *shards)
    # The shards finished before the kill are kept byte for byte, not redone.
    assert {name: tree_digests(workdir / name, "*") for name in finished} == kept

    # Every shard holds exactly its rows, each once, as an uninterrupted extraction writes them.
    # The reference is the transformers backend in this process (a second vLLM extraction
    # would cost a server start); test_pipeline holds it to vLLM's files on the trained target.
    for k, name in enumerate(shards):
        assert_shard_matches_transformers(
            workdir / name, run_dir, cfg["target"]["path"], k, num_shards, cfg["hidden_states"]["dtype"], tmp_path / f"shard_{k}"
        )  # fmt: skip


def test_interrupted_training_continues_from_its_checkpoint(small_run):
    workdir, run_dir, cfg = small_run["workdir"], small_run["run_dir"], small_run["cfg"]
    target = f"{cfg['run_dir']}/train/train_metrics.json"
    train_dir = run_dir / ".eaglenest" / "train"

    def epochs_saved() -> int:
        return len(list(train_dir.glob("*/checkpoints/[0-9]*/model.safetensors")))

    def epochs_validated() -> int:
        return sum(len(f.read_text().splitlines()) for f in train_dir.glob("*/epoch_metrics.jsonl"))

    # Killed once an epoch is saved and validated (speculators saves before validating; an
    # interrupt in between leaves that epoch out of the curves, see EpochMetricsFile).
    proc = start_snakemake(workdir, small_run["configfile"], target)
    kill_when(proc, lambda: train_dir.exists() and epochs_validated() >= 1)
    done = epochs_saved()
    assert done < cfg["train"]["epochs"]

    snakemake(workdir, small_run["configfile"], "--cores", "2", "--rerun-incomplete", target)
    log = (run_dir / "logs" / "train_draft.log").read_text()
    assert f"{done} of {cfg['train']['epochs']} epochs already done (resuming)" in log
    # speculators continued after the saved epochs instead of starting at step 0.
    assert "Training epoch 1/" not in log.split("(resuming)")[-1]
    metrics = json.loads((run_dir / "train" / "train_metrics.json").read_text())
    assert metrics["resumed_from_epoch"] == done - 1
    assert metrics["final_epoch"] == cfg["train"]["epochs"] - 1
    # The curves hold every epoch, those before the interrupt included.
    assert [m["epoch"] for m in metrics["per_epoch"]] == list(range(cfg["train"]["epochs"]))
