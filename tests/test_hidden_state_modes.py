"""hidden_states.mode (offline, online, hybrid) and fp8 storage.

The fast tests check the plan (each mode's peak disk, the refusal's ways out) and the fp8 file
format against the trainer's own reader (hs_connectors). The engine tests run the real
workflow: online training of the seed miniature in fp8 extracts everything from the run's server
each epoch and leaves no hidden-state file behind; hybrid training in bfloat16, killed and
resumed, extracts each sample once and keeps it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, default_config, planned_jobs, snakemake, write_config

from eaglenest.core.errors import EaglenestError
from eaglenest.hidden_states.extract import FP8, plan_stage, stored_tensors, validate_sample
from eaglenest.planning.plan import format_plan
from eaglenest.planning.run_estimate import estimate_hidden_states, hidden_state_bytes

EXTRACTION_REQUEST = '"POST /v1/completions HTTP/1.1" 200'


# --- the plan ------------------------------------------------------------------------------


def test_plan_states_the_peak_disk_of_every_mode(tmp_path):
    cfg = default_config()
    cfg["tokenize"]["max_seq_len"] = 256
    cfg["train"]["num_workers"] = 2
    cfg["vllm"]["device"] = "cpu"
    meta = tmp_path / cfg["run_dir"] / "tokenized" / "metadata.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"tokens_total": 10_000, "samples_out": 50}))
    est = estimate_hidden_states(cfg, tmp_path)
    total = 10_000 * 4 * 128 * 2
    # online holds one sample of at most max_seq_len tokens per data-loader worker
    assert est["peak_disk"] == {"offline": total, "online": 2 * 256 * 4 * 128 * 2, "hybrid": total}
    plan = {
        "run_dir": cfg["run_dir"],
        "nothing_to_do": True,
        "hidden_states": est,
        "target": {"source": "built by the workflow", "name": "t", "gpu_memory": {}},
        "exports": ["vllm"],
        "gpu_order": [],
    }
    text = format_plan(plan)
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("    ")}
    assert "10.24 MB" in lines["offline"] and "10.24 MB" in lines["hybrid"]
    assert "524.29 kB" in lines["online"]
    assert lines["offline"].endswith("<- this run")


def test_fp8_storage_is_about_half_of_bfloat16():
    bf16 = hidden_state_bytes(1000, 7168, "bfloat16")
    fp8 = hidden_state_bytes(1000, 7168, FP8)
    assert fp8 == 1000 * (4 * 7168 + 4 * 4)  # a float32 scale per token and slot beside the values
    assert 0.5 <= fp8 / bf16 < 0.501


def _plan(tmp_path, untrained_target, mode, dtype="bfloat16", margin_gb=0.0):
    meta = tmp_path / "metadata.json"
    meta.write_text(json.dumps({"tokens_total": 1000, "samples_out": 10, "max_seq_len": 128}))
    return plan_stage(
        metadata_path=meta,
        target=str(untrained_target),
        aux_layer_ids=None,
        out_dir=tmp_path,
        num_shards=2,
        dtype=dtype,
        mode=mode,
        data_loaders=1,
        disk_margin_gb=margin_gb,
        plan_path=tmp_path / f"plan-{mode}.json",
    )


def test_storage_refusal_names_the_modes_and_fp8_as_ways_out(tmp_path, untrained_target):
    with pytest.raises(EaglenestError) as e:
        _plan(tmp_path, untrained_target, "offline", margin_gb=1e9)
    msg = str(e.value)
    assert "hidden_states.mode: online" in msg and "hidden_states.mode: hybrid" in msg
    assert f"hidden_states.dtype: {FP8}" in msg
    assert not (tmp_path / "plan-offline.json").exists()
    # Already online and in fp8: no way out left but the disk itself.
    with pytest.raises(
        EaglenestError,
        match=r"not enough disk for hidden states in online mode: .* GB free\. "
        r"Free disk or lower hidden_states\.disk_margin_gb\.$",
    ) as e:
        _plan(tmp_path, untrained_target, "online", dtype=FP8, margin_gb=1e9)
    assert "Ways out" not in str(e.value)


def test_the_plan_checks_the_chosen_modes_peak(tmp_path, untrained_target):
    plan = _plan(tmp_path, untrained_target, "online")
    peaks = plan["peak_disk_bytes"]
    assert peaks["offline"] == peaks["hybrid"] == hidden_state_bytes(1000, 128, "bfloat16")
    assert peaks["online"] == hidden_state_bytes(128, 128, "bfloat16")
    assert json.loads((tmp_path / "plan-online.json").read_text())["mode"] == "online"


# --- the fp8 format --------------------------------------------------------------------------


def test_fp8_files_are_what_the_trainers_fp8_reader_reads(tmp_path):
    from hs_connectors.transfer import FP8Transfer
    from safetensors.torch import save_file

    torch.manual_seed(0)
    hidden = torch.randn(50, 4, 64) * torch.logspace(-2, 3, 50)[:, None, None]  # outliers past fp8's 448
    ids = torch.arange(50)
    save_file(stored_tensors(hidden, ids, FP8), str(tmp_path / "hs_7.safetensors"))
    save_file(stored_tensors(hidden, ids, "bfloat16"), str(tmp_path / "bf16.safetensors"))
    ratio = (tmp_path / "hs_7.safetensors").stat().st_size / (tmp_path / "bf16.safetensors").stat().st_size
    assert ratio < 0.56  # the values' half, and 4 float32 scales per token (3% of them at 64 wide)
    sample = FP8Transfer(tmp_path, dequantize_dtype=torch.float32).get_cached(7)
    assert sample["token_ids"].tolist() == ids.tolist()
    # e4m3 keeps 3 mantissa bits: each value within 1/16 of its slot's largest on that token
    err = (sample["hidden_states"] - hidden).abs().amax(dim=2)
    assert torch.all(err <= hidden.abs().amax(dim=2) / 16)
    from safetensors.torch import load_file

    validate_sample(load_file(str(tmp_path / "hs_7.safetensors")), ids.tolist(), 64, "hs_7")


def _outlier_in_the_last_slot(tokens=64, hidden=256) -> torch.Tensor:
    """States shaped like a real target's: the last slot (the final layer's input) holds a
    channel far larger than anything in the auxiliary slots."""
    torch.manual_seed(0)
    states = torch.randn(tokens, 4, hidden)
    states[:, 3, 7] = 2e5
    return states


def test_fp8_keeps_each_slot_although_another_slot_holds_an_outlier():
    from hs_connectors.fp8_utils import quantize_tensor_to_fp8

    from eaglenest.hidden_states.fp8 import slot_errors

    states = _outlier_in_the_last_slot()
    values, scales = quantize_tensor_to_fp8(states)  # the engine connector's scale per token
    per_token = slot_errors(states, values, scales).mean(dim=0)
    stored = stored_tensors(states, torch.arange(64), FP8)
    per_slot = slot_errors(states, stored["hidden_states"], stored["hidden_states_scales"]).mean(dim=0)
    assert per_token[0] > 0.2  # slot 0 pushed into fp8's subnormals by the last slot's outlier
    assert torch.all(per_slot < 0.04), per_slot  # fp8's own rounding, in every slot


def test_an_fp8_shard_records_each_slots_error_and_a_shard_past_the_limit_is_not_stored(
    tmp_path, untrained_target, monkeypatch
):
    from eaglenest.hidden_states import fp8
    from eaglenest.hidden_states.extract import extract_shard_transformers

    tokenized = tmp_path / "tokenized_data.jsonl"
    tokenized.write_text(
        "".join(json.dumps({"id": str(i), "input_ids": [5 + i, 9, 12, 40 + i]}) + "\n" for i in range(3))
    )
    shard = dict(num_rows=3, shard=0, num_shards=1, aux_layer_ids=[0, 1, 1], dtype=FP8)
    meta = {"shard": 0}
    stats = extract_shard_transformers(untrained_target, tokenized, tmp_path / "shard_0", **shard, meta=meta)
    record = stats["fp8_error"]
    assert record["tokens"] == 12 and len(record["mean_per_slot"]) == 4
    assert all(
        0 < m <= w < fp8.MAX_SLOT_ERROR for m, w in zip(record["mean_per_slot"], record["max_per_slot"])
    )
    assert json.loads((tmp_path / "shard_0" / "manifest.json").read_text())["fp8_error"] == record

    monkeypatch.setattr(fp8, "MAX_SLOT_ERROR", 1e-4)  # as if these states lost too much in fp8
    with pytest.raises(
        EaglenestError, match=r"shard 0 \(rows 0\.\.3\): fp8 would change .* slot 0 .*bfloat16"
    ):
        extract_shard_transformers(untrained_target, tokenized, tmp_path / "shard_0b", **shard, meta=meta)
    assert not (tmp_path / "shard_0b").exists()
    assert not list(tmp_path.glob(".shard_0b*"))  # nor a temporary folder


def test_offline_fp8_extraction_quantizes_in_the_stage_and_online_in_the_engine(tmp_path):
    """Offline, vLLM's plain connector hands over the engine's dtype and the stage quantizes
    per slot (measuring); online the trainer reads what the engine's fp8 connector writes."""
    from eaglenest.hidden_states.extract import extraction_server_spec

    plan = {"aux_layer_ids": [1, 2, 3], "target_num_layers": 6}
    server_cfg = {"env": {}, "base_args": [], "device": "cpu"}

    def connector(dtype, device, online):
        cfg = {**server_cfg, "device": device}
        spec = extraction_server_spec(tmp_path, "t", plan, cfg, dtype, online=online)
        return json.loads(spec.args[spec.args.index("--kv-transfer-config") + 1])["kv_connector"]

    for device, prefix in (("cpu", "Cpu"), ("cuda", "")):
        assert connector(FP8, device, online=False) == f"{prefix or 'Example'}HiddenStatesConnector"
        assert connector("bfloat16", device, online=False) == f"{prefix or 'Example'}HiddenStatesConnector"
        assert connector(FP8, device, online=True) == f"{prefix}FP8HiddenStatesConnector"


@pytest.mark.parametrize("engine_dtype", [torch.float32, torch.bfloat16])
def test_hybrid_keeps_each_sample_in_the_stored_dtype_once_validated(tmp_path, engine_dtype):
    """The engine's file (in the server's dtype) is kept as the row's cached file in the
    configured dtype: linked when it already is, converted once when not; nothing appears
    under the final name before `keep()`, and a discarded sample leaves nothing."""
    from hs_connectors.transfer import FileTransfer
    from safetensors.torch import load_file, save_file

    from eaglenest.hidden_states.online import KeepGenerated

    spool, kept = tmp_path / "spool", tmp_path / "kept"
    spool.mkdir(), kept.mkdir()
    hidden = torch.randn(9, 4, 16)
    engine_file = spool / "req-1.safetensors"
    save_file({"hidden_states": hidden.to(engine_dtype), "token_ids": torch.arange(9)}, str(engine_file))
    transfer = KeepGenerated(FileTransfer(kept), "bfloat16")
    transfer.file_idx = 5
    sample = transfer.get_generated({"hidden_states_path": str(engine_file)})
    assert sample["hidden_states"].dtype == engine_dtype  # the trainer gets what the engine wrote
    assert not (kept / "hs_5.safetensors").exists()
    transfer.keep()
    transfer.delete(str(engine_file))  # what speculators does once the sample is valid
    stored = load_file(str(kept / "hs_5.safetensors"))
    assert stored["hidden_states"].dtype == torch.bfloat16
    assert torch.equal(stored["hidden_states"], hidden.to(torch.bfloat16))
    assert transfer.get_cached(5)["token_ids"].tolist() == list(range(9))
    assert sorted(p.name for p in kept.iterdir()) == ["hs_5.safetensors"]
    # A sample speculators rejected is not kept.
    save_file({"hidden_states": hidden.to(engine_dtype), "token_ids": torch.arange(9)}, str(engine_file))
    transfer.file_idx = 6
    transfer.get_generated({"hidden_states_path": str(engine_file)})
    transfer.discard()
    assert sorted(p.name for p in kept.iterdir()) == ["hs_5.safetensors"]


# --- the real workflow -----------------------------------------------------------------------


def extraction_requests(run_dir: Path) -> int:
    """Requests the run's extraction server answered, from its own access log (the server
    logs whose command line names the extract_hidden_states method)."""
    count = 0
    for log in (run_dir / ".eaglenest" / "server").glob("server-*.log"):
        text = log.read_text(errors="replace")
        if "extract_hidden_states" in text:
            count += text.count(EXTRACTION_REQUEST)
    return count


def hidden_state_files(run_dir: Path) -> list[Path]:
    """Every hidden-state file under the run folder that takes disk: shard and kept samples
    (`hs_<row>`), and whatever is in the engine's spool; not the links an offline training
    folder holds into its shards, nor model weights."""
    return [
        p
        for p in run_dir.rglob("*.safetensors*")
        if not p.is_symlink() and (p.name.startswith("hs_") or "hidden_states_spool" in p.parts)
    ]


@pytest.fixture(scope="module")
def modes_run(tmp_path_factory, untrained_target):
    """24 prompts on the untrained tiny target (weights do not matter here), run up to what
    training in any mode starts from: the tokenized rows, the draft's vocabulary and config."""
    workdir = tmp_path_factory.mktemp("modes")
    cfg = default_config()
    cfg["target"]["path"] = str(untrained_target)
    cfg["target"]["build_tiny"] = None
    cfg["prompts"]["sources"] = [{"name": "default", "type": "bundled", "samples": 24}]
    cfg["prompts"]["eval_samples"] = 4
    cfg["regenerate"]["max_tokens"] = 48
    cfg["train"]["epochs"] = 2
    configfile = write_config(workdir, cfg)
    rd = cfg["run_dir"]
    upstream = [f"{rd}/tokenized/metadata.json", f"{rd}/vocab/t2d.pt", f"{rd}/draft_config.json"]
    snakemake(workdir, configfile, "--cores", "2", *upstream)
    return {"workdir": workdir, "cfg": cfg, "run_dir": workdir / rd}


def rows(run_dir: Path) -> list[list[int]]:
    lines = (run_dir / "tokenized" / "tokenized_data.jsonl").read_text().splitlines()
    return [json.loads(line)["input_ids"] for line in lines]


@pytest.mark.engine
def test_hybrid_training_killed_and_resumed_extracts_each_sample_once(modes_run):
    """Hybrid in bfloat16, killed in its first epoch and resumed: the rows kept before the kill
    are read back, the rest extracted, none twice. (Online in fp8, the other wire format, is the
    seed miniature's test below.)"""
    workdir, cfg, run_dir = modes_run["workdir"], modes_run["cfg"], modes_run["run_dir"]
    cfg = {**cfg, "hidden_states": {**cfg["hidden_states"], "mode": "hybrid", "dtype": "bfloat16"}}
    configfile = write_config(workdir, cfg, "hybrid.yaml")
    target = f"{cfg['run_dir']}/train/train_metrics.json"
    planned = planned_jobs(snakemake(workdir, configfile, "-n", target))
    assert set(planned) == {"plan_hidden_states", "train_draft"}, planned

    n = len(rows(run_dir))
    before = extraction_requests(run_dir)
    kept_root = run_dir / ".eaglenest" / "hidden_states_kept"

    def kept() -> list[Path]:
        return list(kept_root.glob("*/hs_*.safetensors"))

    cmd = [
        sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir),
        "--configfile", str(configfile), "--cores", "2", target,
    ]  # fmt: skip
    with open(workdir / "killed-hybrid.log", "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 900
    while len(kept()) < n // 3:
        assert proc.poll() is None, (workdir / "killed-hybrid.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the first epoch kept nothing"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # in the first epoch: a lost node
    proc.wait()
    snakemake(workdir, configfile, "--unlock")
    kept_at_kill = len(kept())
    assert kept_at_kill < n
    requests_at_kill = extraction_requests(run_dir)

    snakemake(workdir, configfile, "--cores", "2", "--rerun-incomplete", target)
    # The resumed run extracted exactly the rows not kept (none twice), then read all back.
    assert extraction_requests(run_dir) - requests_at_kill == n - kept_at_kill
    # A request in flight when the node died is the only one that may have been sent twice.
    assert n <= extraction_requests(run_dir) - before <= n + 1
    files = sorted(kept(), key=lambda p: int(p.stem.split("_")[1]))
    assert [int(p.stem.split("_")[1]) for p in files] == list(range(n))
    from safetensors.torch import load_file

    for p, ids in zip(files, rows(run_dir)):
        data = load_file(str(p))
        assert data["hidden_states"].dtype == torch.bfloat16
        validate_sample(data, ids, 128, str(p))
    metrics = json.loads((run_dir / "train" / "train_metrics.json").read_text())
    assert metrics["hidden_states_mode"] == "hybrid" and metrics["hidden_states_kept"] == n
    assert not list((run_dir / ".eaglenest" / "hidden_states_spool").rglob("*.safetensors"))


@pytest.mark.engine
def test_the_seed_miniature_trains_online_in_fp8_and_stores_nothing(kimi_mini_run, tmp_path):
    """The Kimi-K2.5 miniature (MLA, MoE, nested multimodal config, remote-code tokenizer),
    copied whole into another folder (a moved checkout: nothing to do), then switched to online
    fp8 there: only training reruns, every epoch sends every row to the run's server, the
    engine's fp8 connector and the trainer's fp8 reader meet over the wire, and nothing is
    stored."""
    import shutil
    import stat

    import yaml

    def sockets(folder, names):  # the stopped servers' IPC sockets cannot be copied
        return [n for n in names if stat.S_ISSOCK(os.lstat(os.path.join(folder, n)).st_mode)]

    work = tmp_path / "kimi"
    shutil.copytree(kimi_mini_run["workdir"], work, symlinks=True, ignore=sockets)  # copy2 keeps mtimes
    env = {**kimi_mini_run["env"], "HF_HOME": str(work / "hf-home")}
    # The finished run in a moved checkout whose files a clone has just written (the same run
    # folder; the repository's files newer than every output): its repository inputs are named
    # relative to the checkout and compared by content, so nothing is planned.
    for name in ("Snakefile", "scripts", "rules", "data", "eaglenest", "config", "profiles"):
        for f in [work / name, *(work / name).rglob("*")]:
            os.utime(f)
    moved = snakemake(work, work / "config" / "kimi-mini.yaml", "-n", env=env)
    assert planned_jobs(moved) == {} and "Nothing to be done" in moved.stdout + moved.stderr
    cfg = yaml.safe_load(kimi_mini_run["configfile"].read_text())
    cfg["hidden_states"].update(mode="online", dtype=FP8)
    cfg["train"]["epochs"] = 2  # the wiring, not the draft's quality: two epochs show it (CI time)
    configfile = write_config(work, cfg, "online-fp8.yaml")
    run_dir, target = work / cfg["run_dir"], f"{cfg['run_dir']}/train/train_metrics.json"
    for shard in run_dir.glob("hidden_states/shard_*"):
        shutil.rmtree(shard)  # the offline run's shards: online needs none
    planned = planned_jobs(snakemake(work, configfile, "-n", target, env=env))
    assert set(planned) == {"plan_hidden_states", "train_draft"}, planned

    before = extraction_requests(run_dir)
    snakemake(work, configfile, "--cores", "2", target, env=env)
    assert extraction_requests(run_dir) - before == cfg["train"]["epochs"] * len(rows(run_dir))
    assert hidden_state_files(run_dir) == []
    metrics = json.loads((run_dir / "train" / "train_metrics.json").read_text())
    assert metrics["hidden_states_mode"] == "online"
    assert metrics["final_epoch"] == cfg["train"]["epochs"] - 1
    log = (run_dir / "logs" / "train_draft.log").read_text()
    assert "--hidden-states-backend fp8" in log
    assert "--on-missing generate --vllm-endpoint http://127.0.0.1:" in log  # the run's own server
