"""Faults a long run meets (issue: corrupted shards, full disks, preemption, hung servers,
repeated kills), each on small CPU material."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import default_config, trainer_inputs

from eaglenest import cli
from eaglenest.core.errors import EaglenestError
from eaglenest.engine.server import Server, ServerError
from eaglenest.hidden_states.extract import write_shard
from eaglenest.hidden_states.shard_check import verify_shards

REPO = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------------------------
# 1. A shard file corrupted or truncated after its job finished


def _shard(folder, rows: range, hidden: int = 8):
    """A shard as extraction leaves it: safetensors files and a manifest listing them."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    samples = ((i, torch.randn(5 + i, 4, hidden), torch.arange(5 + i)) for i in rows)
    meta = {"aux_layer_ids": [1, 2, 3]}
    write_shard(
        folder, samples, rows=(rows.start, rows.stop), hidden_size=hidden, dtype="bfloat16", meta=meta
    )
    return folder


@pytest.fixture
def shards(tmp_path):
    root = tmp_path / "results" / "hidden_states"
    return [_shard(root / "shard_0", range(0, 3)), _shard(root / "shard_1", range(3, 6))]


def test_intact_shards_pass_with_and_without_checksums(shards):
    assert verify_shards(shards) == {"shards": 2, "files": 6, "checksums": False}
    assert verify_shards(shards, checksums=True)["checksums"]
    manifest = json.loads((shards[1] / "manifest.json").read_text())
    assert list(manifest["files"]) == ["hs_3.safetensors", "hs_4.safetensors", "hs_5.safetensors"]


def test_a_truncated_file_is_named_with_its_shard_and_the_command_that_rebuilds_it(shards):
    bad = shards[1] / "hs_4.safetensors"
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])  # a partial copy
    with pytest.raises(EaglenestError) as e:
        verify_shards(shards)
    msg = str(e.value)
    assert f"{bad} (shard shard_1)" in msg and "the manifest says" in msg
    assert f"snakemake --cores all --force {shards[1]}" in msg
    assert f"--force {shards[0]}" not in msg  # the intact shard is not to be rebuilt


def test_a_truncated_file_without_a_size_record_fails_on_its_header(shards):
    """Shards written before manifests listed files are still checked, by their headers."""
    manifest = json.loads((shards[0] / "manifest.json").read_text())
    del manifest["files"]
    (shards[0] / "manifest.json").write_text(json.dumps(manifest))
    bad = shards[0] / "hs_1.safetensors"
    bad.write_bytes(bad.read_bytes()[:-7])
    with pytest.raises(EaglenestError, match=r"hs_1.safetensors \(shard shard_0\): data should end at byte"):
        verify_shards(shards)


def test_a_flipped_byte_passes_the_cheap_check_and_fails_the_checksums(shards):
    bad = shards[0] / "hs_2.safetensors"
    data = bytearray(bad.read_bytes())
    data[-3] ^= 0xFF  # inside the tensor data: same size, same header
    bad.write_bytes(bytes(data))
    verify_shards(shards)
    with pytest.raises(EaglenestError, match=r"hs_2.safetensors \(shard shard_0\): sha256 differs"):
        verify_shards(shards, checksums=True)


def test_a_missing_file_and_a_garbled_header_are_both_reported(shards):
    (shards[0] / "hs_0.safetensors").unlink()
    bad = shards[1] / "hs_5.safetensors"
    data = bytearray(bad.read_bytes())
    data[8:12] = b"\x00\xff\x00\xff"  # inside the JSON header
    bad.write_bytes(bytes(data))
    with pytest.raises(EaglenestError) as e:
        verify_shards(shards)
    assert "hs_0.safetensors (shard shard_0): missing" in str(e.value)
    assert "hs_5.safetensors (shard shard_1): header is not valid JSON" in str(e.value)
    assert "2 hidden-state file(s) in 2 shard(s)" in str(e.value)


def test_verify_shards_command_takes_the_hidden_states_folder(shards, capsys):
    assert cli.main(["verify-shards", str(shards[0].parent), "--checksums"]) == 0
    assert "ok: 6 files in 2 shards, checksums match" in capsys.readouterr().out
    f = shards[1] / "hs_3.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    assert cli.main(["verify-shards", str(shards[0].parent)]) == 1
    assert f"--force {shards[1]}" in capsys.readouterr().err


def test_training_refuses_a_truncated_shard_before_it_starts_anything(shards, tmp_path):
    """The train stage checks the files first: no training folder, no server released."""
    from eaglenest.training.train import train_stage

    bad = shards[0] / "hs_0.safetensors"
    bad.write_bytes(bad.read_bytes()[:-1])
    run_dir = tmp_path / "results"
    with pytest.raises(EaglenestError, match="nothing was trained on them"):
        train_stage(
            run_dir=run_dir,
            target=None,
            shard_dirs=[str(s) for s in shards],
            tokenized_path=None,
            t2d_npy=None,
            d2t_npy=None,
            draft_config_path=None,
            hp={},
            gpus=0,
            device="cpu",
            out_checkpoint=run_dir / "train" / "checkpoint",
            out_metrics=run_dir / "train" / "metrics.json",
            out_curves=run_dir / "train" / "curves.png",
            log_file=None,
        )
    assert not (run_dir / ".eaglenest").exists() and not (run_dir / "train").exists()


# --------------------------------------------------------------------------------------------
# 4. A server that hangs: alive, accepting connections, never answering

# An OpenAI-style server on PORT (0: any) that answers its first ANSWER requests, then accepts and
# never replies. Like vLLM given VLLM_API_KEY, it wants that token on /v1 (401 otherwise). Each
# request it receives is a line in the file REQUESTS, so a test waits for it, not for a time.
FAKE_SERVER = """
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
answer, port, seen = int(sys.argv[1]), int(sys.argv[2]), [0]
content = "x" * int(sys.argv[3]) if len(sys.argv) > 3 else "ok"
requests_log = sys.argv[4] if len(sys.argv) > 4 else os.devnull
key = os.environ.get("VLLM_API_KEY", "")
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        ok = self.path == "/health" or not key or self.headers.get("Authorization") == "Bearer " + key
        self.send_response(200 if ok else 401); self.send_header("Content-Length", "0"); self.end_headers()
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        seen[0] += 1
        with open(requests_log, "a") as f:
            f.write(self.path + "\\n")
        if seen[0] > answer:
            time.sleep(3600)
        body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "target",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
s = ThreadingHTTPServer(("127.0.0.1", port), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


@contextlib.contextmanager
def fake_server(tmp_path, answer: int, api_key: str = "", answer_chars: int = 2):
    env = {**os.environ, "VLLM_API_KEY": api_key}
    cmd = [
        sys.executable,
        "-c",
        FAKE_SERVER,
        str(answer),
        "0",
        str(answer_chars),
        str(tmp_path / "fake-requests.log"),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    try:
        port = int(proc.stdout.readline())
        log = tmp_path / f"server-{port}.log"
        log.write_text("INFO: the fake server's log\n")
        yield Server(pid=proc.pid, port=port, key="fake", log_path=str(log), api_key=api_key)
    finally:
        proc.kill()
        proc.wait()


def wait_for_requests(tmp_path, n: int, proc, timeout_s: float = 60) -> None:
    """Until the fake server has received `n` requests (the stage process still running)."""
    log, deadline = tmp_path / "fake-requests.log", time.monotonic() + timeout_s
    while not (log.exists() and len(log.read_text().splitlines()) >= n):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)


def _prompts(tmp_path, n: int):
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
            for i in range(n)
        )
    )
    return path


def test_regeneration_against_a_hung_server_ends_within_the_bound_and_keeps_what_was_answered(tmp_path):
    from eaglenest.data.regenerate import progress_path, regenerate_responses

    prompts, out, run_dir = _prompts(tmp_path, 4), tmp_path / "raw_responses.jsonl", tmp_path / "run"
    kw = {"target": "org/model", "sampling": {}, "concurrency": 1, "max_retries": 5, "request_timeout_s": 1.0}
    stall = 3.0
    with fake_server(tmp_path, answer=2) as server:
        t0 = time.monotonic()
        with pytest.raises(
            ServerError,
            match=r"is alive but has answered no request for \d+ s \(vllm.stall_timeout_s: 3\); it is hung",
        ) as e:
            regenerate_responses(server, prompts, out, run_dir, stall_timeout_s=stall, **kw)
        took = time.monotonic() - t0
    # Hung only once silent for the bound (not at the first failed request), and then it ends:
    # the bound, one request timeout and a backoff, with a generous margin for a loaded machine;
    # without it each hung prompt's five retries would take 37 s (1 s each, 1+2+4+8+16 s backoff).
    assert int(re.search(r"no request for (\d+) s", str(e.value)).group(1)) >= stall
    assert took < 5 * (stall + kw["request_timeout_s"] + 4.0)
    assert "the fake server's log" in str(e.value)  # its log tail, for the user
    assert not out.exists()
    rows = [
        json.loads(line) for line in progress_path(run_dir, "fake", {}, "org/model").read_text().splitlines()
    ]
    answered = [r["id"] for r in rows if "error" not in r]
    assert len(answered) == 2 and set(answered) < {"p0", "p1", "p2", "p3"}
    with fake_server(tmp_path, answer=100) as healthy:  # the rerun sends only what is unanswered
        healthy = dataclasses.replace(healthy, key="fake")
        counts = regenerate_responses(healthy, prompts, out, run_dir, stall_timeout_s=3.0, **kw)
    assert (counts["resumed"], counts["sent"], counts["failed"]) == (2, 2, 0)


def test_evaluation_against_a_hung_server_fails_within_twice_the_stall_timeout(tmp_path):
    """A request and its retry each wait stall_timeout_s; then the stage fails at once (the
    requests still in flight end on their own timeouts while the process exits)."""
    from eaglenest.evaluation.asking import generate

    prompts = [json.loads(line) for line in _prompts(tmp_path, 40).read_text().splitlines()]
    stall, concurrency = 0.75, 2
    with fake_server(tmp_path, answer=0) as server:
        before = set(threading.enumerate())
        t0 = time.monotonic()
        with pytest.raises(ServerError, match=r"\(vllm.stall_timeout_s: 0.75\); it is hung"):
            generate(server, prompts, max_tokens=4, concurrency=concurrency, stall_timeout_s=stall)
        took = time.monotonic() - t0
        for worker in set(threading.enumerate()) - before:  # until the requests in flight time out
            worker.join(timeout=10 * 2 * stall)
        sent = len((tmp_path / "fake-requests.log").read_text().splitlines())
    # The queued prompts are dropped, not sent to the hung server: of the 80 requests the 40
    # prompts would send, only the failing one and its retry, the others in flight and those a
    # worker picked up as it failed (each with its retry).
    assert 2 <= sent <= 2 * 2 * concurrency
    # Twice the bound (and a backoff), with an order of magnitude's margin for a loaded machine;
    # working through the 40 prompts would take 20 rounds of two attempts.
    assert took < 10 * 2 * stall


# --------------------------------------------------------------------------------------------
# 5. Two runs at once


def test_a_port_answered_by_another_runs_server_is_never_taken_for_ours(tmp_path):
    """Each server has its own token: another run's server on the same port answers 401."""
    from eaglenest.engine.server import PortTaken, wait_healthy

    with fake_server(tmp_path, answer=0, api_key="theirs") as theirs:
        wait_healthy(theirs, timeout_s=10)  # its own token: healthy
        ours = dataclasses.replace(theirs, api_key="ours")
        assert not ours.healthy()
        with pytest.raises(PortTaken, match=f"port {theirs.port} is served by another process"):
            wait_healthy(ours, timeout_s=10)


def test_start_moves_to_another_port_when_the_first_is_taken(tmp_path, monkeypatch, caplog):
    from eaglenest.engine import server as srv

    with fake_server(tmp_path, answer=0, api_key="theirs") as theirs:
        ports = iter([theirs.port, srv.free_port()])
        monkeypatch.setattr(srv, "free_port", lambda: next(ports))
        # Our "server" is the fake one too, on the port it is given (binding a taken port fails).
        monkeypatch.setattr(
            srv, "server_command", lambda spec, port: [sys.executable, "-c", FAKE_SERVER, "0", str(port)]
        )
        ours = srv.start(srv.ServerSpec(model="m"), tmp_path / "run", tmp_path / "ours.log", timeout_s=20)
        try:
            assert ours.port != theirs.port and ours.healthy() and ours.api_key not in (theirs.api_key, "")
            assert f"port {theirs.port} is served by another process" in caplog.text
        finally:
            srv.stop_pid(ours.pid)


def _workflow(workdir, run_dir, *targets):
    """The real workflow on the default config, in `workdir`, writing into `run_dir`."""
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "--cores",
        "1",
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
    ]
    cmd += [
        "--configfile",
        str(REPO / "config" / "config.yaml"),
        "--config",
        f"run_dir={run_dir}",
        "--",
        *targets,
    ]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_run_folder_in_use_by_another_workflow_is_refused_with_what_to_do(tmp_path):
    from eaglenest.pipeline.run_guard import claim_run_folder

    run_dir = tmp_path / "shared_run"
    claim_run_folder(run_dir)  # another workflow (this test process) holds the run folder
    proc = _workflow(tmp_path / "elsewhere", run_dir, f"{run_dir}/prompts/prompts.jsonl")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert f"run folder {run_dir} is in use by another workflow (pid {os.getpid()} on" in out
    assert "Wait for it to end or stop it, or give this run its own run_dir" in out
    assert [p.name for p in run_dir.rglob("*") if p.is_file()] == ["run.lock"]  # nothing written


def test_two_run_folders_run_at_once_and_touch_only_their_own_files(tmp_path):
    runs = {name: tmp_path / name / "run" for name in ("a", "b")}
    procs = {
        name: _workflow(tmp_path / name, run, f"{run}/prompts/prompts.jsonl") for name, run in runs.items()
    }
    for proc in procs.values():
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, out
    for name, run in runs.items():
        files = [p.relative_to(tmp_path) for p in run.rglob("*") if p.is_file()]
        assert Path(name, "run", "prompts", "prompts.jsonl") in files
        assert all(f.parts[0] == name for f in files)
    assert (runs["a"] / "prompts" / "prompts.jsonl").read_bytes() == (
        runs["b"] / "prompts" / "prompts.jsonl"
    ).read_bytes()


# --------------------------------------------------------------------------------------------
# 2. A full disk: real ones, small tmpfs mounts


@pytest.fixture
def small_disk(tmp_path):
    """small_disk(name, kB): a folder on a filesystem of that size (a tmpfs; needs root)."""
    mounts = []

    def make(name: str, size_kb: int) -> Path:
        path = tmp_path / name
        path.mkdir()
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            why = f"a full disk is a small tmpfs here, and mounting one failed (root needed): {r.stderr.strip()}"
            pytest.fail(why) if os.environ.get("CI") else pytest.skip(why)
        mounts.append(path)
        return path

    yield make
    for path in reversed(mounts):
        subprocess.run(["umount", "-l", str(path)], check=False)


def resize(path: Path, size_kb: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size_kb}k", str(path)], check=True)


def assert_disk_full_message(err: EaglenestError, folder: Path) -> None:
    msg = str(err)
    assert str(folder) in msg and "no space left for" in msg
    assert "it needs about" in msg and "are free" in msg and "rerun" in msg


@pytest.fixture(scope="module")
def tiny_model(untrained_target) -> Path:
    """A small Llama with the default target's tokenizer; its weights do not matter here."""
    return untrained_target


def test_tokenize_on_a_full_disk_names_the_folder_and_leaves_nothing(tmp_path, small_disk, tiny_model):
    from eaglenest.core.io import DiskFull
    from eaglenest.data.tokenize import tokenize_stage

    responses = tmp_path / "raw_responses.jsonl"
    rows = [
        {
            "id": f"r{i}",
            "messages": [
                {"role": "user", "content": f"Question {i}?"},
                {"role": "assistant", "content": "An answer. " * 40},
            ],
        }
        for i in range(60)
    ]
    responses.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = small_disk("tokenized", 24)
    outputs = [out / "tokenized_data.jsonl", out / "token_freq.pt", out / "metadata.json"]
    with pytest.raises(DiskFull) as e:
        tokenize_stage(responses, tiny_model, 512, "truncate", *outputs)
    assert_disk_full_message(e.value, out)
    assert list(out.iterdir()) == []  # no output, no temporary file
    resize(out, 4096)  # space freed: the rerun completes
    meta = tokenize_stage(responses, tiny_model, 512, "truncate", *outputs)
    assert meta["samples_out"] == 60


def test_regeneration_on_a_full_disk_keeps_whole_answers_and_the_rerun_sends_only_the_rest(
    tmp_path, small_disk
):
    from eaglenest.core.io import DiskFull
    from eaglenest.data.regenerate import load_progress, progress_path, regenerate_responses

    prompts, run_dir = _prompts(tmp_path, 40), small_disk("run", 48)
    out = run_dir / "responses" / "raw_responses.jsonl"
    kw = {
        "target": "org/model",
        "sampling": {},
        "concurrency": 4,
        "max_retries": 0,
        "request_timeout_s": 10.0,
    }
    with fake_server(tmp_path, answer=1000, answer_chars=3000) as server:
        with pytest.raises(DiskFull) as e:
            regenerate_responses(server, prompts, out, run_dir, stall_timeout_s=30.0, **kw)
        pfile = progress_path(run_dir, server.key, {}, "org/model")
        assert_disk_full_message(e.value, pfile.parent)
        assert not out.exists()
        kept = load_progress(pfile)  # a line cut by the full disk is dropped, the rest are whole
        assert 0 < len(kept) < 40 and pfile.read_bytes().endswith(b"\n")
        resize(run_dir, 4096)
        counts = regenerate_responses(server, prompts, out, run_dir, stall_timeout_s=30.0, **kw)
    assert (counts["resumed"], counts["sent"], counts["answered"]) == (len(kept), 40 - len(kept), 40)
    assert sorted(json.loads(line)["id"] for line in out.read_text().splitlines()) == sorted(
        f"p{i}" for i in range(40)
    )


def test_extraction_on_a_full_disk_names_the_shard_and_leaves_no_part_of_it(tmp_path, small_disk, tiny_model):
    from eaglenest.core.io import DiskFull
    from eaglenest.hidden_states.extract import extract_stage

    tokenized = tmp_path / "tokenized_data.jsonl"
    tokenized.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "input_ids": list(range(1, 41)), "loss_mask": [1] * 40}) + "\n"
            for i in range(6)
        )
    )
    plan = {
        "aux_layer_ids": [2, 4, 5],
        "target_num_layers": 8,
        "hidden_size": 128,
        "samples": 6,
        "bytes": 6 * 40 * 4 * 128 * 2,
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    shards = small_disk("hidden_states", 16)
    kw = {"run_dir": tmp_path / "run", "target": str(tiny_model), "tokenized_path": tokenized, "plan_path": tmp_path / "plan.json",
          "num_shards": 1, "dtype": "bfloat16", "backend": "transformers", "concurrency": 1, "server_cfg": {}}  # fmt: skip
    with pytest.raises(DiskFull, match="no space left for hidden-state shard 0") as e:
        extract_stage(out_dir=shards / "shard_0", shard=0, **kw)
    assert_disk_full_message(e.value, shards)
    assert list(shards.iterdir()) == []
    resize(shards, 4096)
    stats = extract_stage(out_dir=shards / "shard_0", shard=0, **kw)
    assert stats["samples"] == 6 and verify_shards([shards / "shard_0"], checksums=True)["files"] == 6


def _checkpoint(folder: Path, params: int = 1000) -> Path:
    """An epoch checkpoint as speculators writes it: weights, config, optimizer state."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file({"w": torch.zeros(params)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}")
    torch.save({"state": {0: torch.zeros(params)}}, folder / "optimizer_state_dict.pt")
    return folder


def test_training_resumes_from_the_last_whole_checkpoint_not_a_half_written_one(tmp_path):
    from eaglenest.training.checkpoints import epochs_done, remove_incomplete_checkpoints

    save = tmp_path / "checkpoints"
    _checkpoint(save / "0")
    cut = _checkpoint(save / "1") / "optimizer_state_dict.pt"
    cut.write_bytes(cut.read_bytes()[:-40])  # the save was cut short
    model = _checkpoint(save / "2") / "model.safetensors"
    model.write_bytes(model.read_bytes()[:-4])
    (save / "3").mkdir()  # killed before it wrote anything
    assert epochs_done(save) == [0]
    remove_incomplete_checkpoints(save)
    assert sorted(p.name for p in save.iterdir()) == ["0"]


def test_a_checkpoint_on_a_full_disk_fails_training_with_the_folder_and_the_bytes(
    tmp_path, small_disk, monkeypatch
):
    from eaglenest.core.io import DiskFull
    from eaglenest.training import trainer
    from eaglenest.training.checkpoints import checkpoint_bytes, epochs_done

    save = small_disk("checkpoints", 64)
    _checkpoint(save / "0", params=2000)  # one whole epoch before the disk filled
    # The trainer's next save runs out of space half-way, as speculators' would.
    writes_too_much = (
        f"import os; os.makedirs('{save}/1'); open('{save}/1/model.safetensors', 'wb').write(bytes(10**6))"
    )
    monkeypatch.setattr(
        trainer, "trainer_command", lambda args, gpus: [sys.executable, "-c", writes_too_much]
    )
    log_file = tmp_path / "train.log"
    with pytest.raises(DiskFull, match="no space left for a training checkpoint") as e:
        trainer.run_trainer([], 1, log_file, tmp_path / "m.jsonl", save, checkpoint_bytes(save, {}))
    assert_disk_full_message(e.value, save)
    assert "No space left on device" in log_file.read_text()
    assert epochs_done(save) == [0] and not (save / "1").exists()  # the resume starts after epoch 0


@pytest.mark.parametrize("algorithm", ["eagle3", "p_eagle", "dflash"])
def test_the_checkpoint_estimate_counts_the_drafts_parameters(tmp_path, untrained_target, algorithm):
    """The estimate against what speculators itself writes: the draft it builds from the draft
    config and the trainer's flags, saved as a checkpoint is (its floats; d2t/t2d are ints)."""
    from safetensors.torch import load_file
    from speculators.model import SpeculatorModel
    from speculators.train.cli import build_draft_model
    from speculators.train.config import TrainConfig

    from eaglenest.draft.config import draft_config_stage, draft_parameter_count
    from eaglenest.training.checkpoints import checkpoint_bytes
    from eaglenest.training.sweep import train_settings
    from eaglenest.training.trainer import trainer_args

    vocab = json.loads((untrained_target / "config.json").read_text())["vocab_size"]
    freq = tmp_path / "token_freq.pt"
    torch.save(torch.zeros(vocab, dtype=torch.int64), freq)
    dcfg = draft_config_stage(
        untrained_target, tmp_path / "draft_config.json", aux_layer_ids=None, draft_vocab_size=vocab // 2,
        draft_layers=2, algorithm=algorithm, token_freq=freq,
    )  # fmt: skip
    args = trainer_args(
        **{**trainer_inputs(), "target": untrained_target, "draft_config": tmp_path / "draft_config.json",
           "draft_vocab_size": vocab // 2, "aux_layer_ids": dcfg["eaglenest"]["aux_layer_ids"]}, cpu=True,
        hp=train_settings(default_config(), algorithm), algorithm=algorithm,
        mask_token_id=dcfg["eaglenest"].get("mask_token", {}).get("id"),
    )  # fmt: skip
    flags = argparse.Namespace(**TrainConfig.resolve(args).flatten())
    t2d = torch.arange(vocab) < vocab // 2  # the draft's vocabulary: the first half of the target's
    draft = build_draft_model(
        flags, SpeculatorModel.registry[flags.speculator_type], t2d, torch.zeros(vocab // 2, dtype=torch.long),
        vocab // 2,
    )  # fmt: skip
    draft.save_pretrained(tmp_path / "checkpoint")
    weights = load_file(tmp_path / "checkpoint" / "model.safetensors")
    floats = sum(w.numel() for w in weights.values() if w.is_floating_point())
    assert draft_parameter_count(dcfg) == floats
    # Before any epoch: the bf16 weights and as much again of optimizer state.
    assert checkpoint_bytes(tmp_path / "no_checkpoints", dcfg) == 2 * 2 * floats


# --------------------------------------------------------------------------------------------
# 3. Preemption: SIGTERM to one stage (what SLURM sends a job), or to the workflow
#    (tests/test_interrupts.py runs the real workflow for that)

STAGE = """
import json, sys
from eaglenest.data.regenerate import regenerate_responses
from eaglenest.engine.server import Server
from eaglenest.pipeline.workflow import run_logged

a = json.loads(sys.argv[1])
run_logged(a["log"], regenerate_responses, Server(**a["server"]), a["prompts"], a["out"], a["run_dir"],
           target="org/model", sampling={}, concurrency=1, max_retries=0, request_timeout_s=60, stall_timeout_s=120)
"""


def test_sigterm_unwinds_a_stage_at_once_and_keeps_its_progress(tmp_path):
    from eaglenest.data.regenerate import load_progress, progress_path

    prompts, run_dir, out, stage_log = (
        _prompts(tmp_path, 6),
        tmp_path / "run",
        tmp_path / "raw.jsonl",
        tmp_path / "stage.log",
    )
    with fake_server(tmp_path, answer=3) as server:  # three answers, then it keeps the fourth waiting
        args = {"log": str(stage_log), "server": dataclasses.asdict(server), "prompts": str(prompts), "out": str(out), "run_dir": str(run_dir)}  # fmt: skip
        proc = subprocess.Popen([sys.executable, "-c", STAGE, json.dumps(args)])
        pfile = progress_path(run_dir, server.key, {}, "org/model")
        wait_for_requests(tmp_path, 4, proc)  # three answered, the fourth in flight
        deadline = time.monotonic() + 60
        while not (pfile.exists() and len(pfile.read_text().splitlines()) == 3):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.terminate()
        # Well before the request's 60 s timeout, the only other way the stage could end.
        assert proc.wait(timeout=30) == 128 + 15
    assert "SIGTERM: stopping; finished work and progress are kept, rerun to resume" in stage_log.read_text()
    assert len(load_progress(pfile)) == 3 and not out.exists()
    assert [p.name for p in tmp_path.glob(".raw.jsonl.tmp-*")] == []


THREADED_STAGE = """
import json, sys
from eaglenest.evaluation.asking import generate
from eaglenest.engine.server import Server
from eaglenest.pipeline.workflow import run_logged

a = json.loads(sys.argv[1])
prompts = [json.loads(line) for line in open(a["prompts"])]
run_logged(a["log"], generate, Server(**a["server"]), prompts, 8, 2, 60.0)
"""


def test_sigterm_ends_a_stage_whose_threads_wait_on_requests(tmp_path):
    """Worker threads in a request would hold the process at exit for up to their timeout
    (60 s here); a preempted stage leaves at once."""
    stage_log = tmp_path / "stage.log"
    with fake_server(tmp_path, answer=0) as server:  # every request waits
        args = {
            "log": str(stage_log),
            "server": dataclasses.asdict(server),
            "prompts": str(_prompts(tmp_path, 4)),
        }
        proc = subprocess.Popen([sys.executable, "-c", THREADED_STAGE, json.dumps(args)])
        wait_for_requests(tmp_path, 2, proc)  # two requests in flight (concurrency 2)
        proc.terminate()
        # Well before the requests' 60 s timeout, which would end the threads otherwise.
        assert proc.wait(timeout=30) == 128 + 15
    assert "SIGTERM: stopping" in stage_log.read_text()


def test_the_slurm_profile_asks_for_sigterm_before_the_time_limit_and_requeues():
    import yaml

    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile["slurm-requeue"] is True
    assert "--signal=TERM@" in profile["default-resources"]["slurm_extra"]
    # No rule replaces the flags without the signal.
    for rule, res in profile.get("set-resources", {}).items():
        assert "--signal=TERM@" in res.get("slurm_extra", "--signal=TERM@"), rule


def test_a_regeneration_that_loses_most_prompts_fails_at_once_and_never_retries_a_rejection(tmp_path):
    """A 400 (here: every prompt over the server's max_model_len) is final: no retries; when
    more than half the prompts fail the stage fails naming the first error, writing no
    output, instead of an empty training set surfacing stages later."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from eaglenest.data.regenerate import regenerate_responses

    posts = []

    class Rejecting(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            posts.append(self.path)
            body = b'{"error": {"message": "This model\'s maximum context length is 16 tokens"}}'
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Rejecting)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    log = tmp_path / "server.log"
    log.write_text("")
    server = Server(pid=os.getpid(), port=httpd.server_address[1], key="fake", log_path=str(log))
    out = tmp_path / "raw_responses.jsonl"
    kw = {"target": "org/model", "sampling": {}, "concurrency": 2, "max_retries": 3, "request_timeout_s": 5.0}
    try:
        with pytest.raises(
            EaglenestError, match=r"4 of 4 prompts failed .*HTTP 400: .*maximum context length"
        ):
            regenerate_responses(
                server, _prompts(tmp_path, 4), out, tmp_path / "run", stall_timeout_s=30.0, **kw
            )
    finally:
        httpd.shutdown()
    assert len(posts) == 4  # one attempt each: a rejection is not retried
    assert not out.exists()
