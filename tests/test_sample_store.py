"""The sample store (eaglenest.hidden_states.store): every extracted sample is kept by the settings
that decide its bytes and by its row's token ids, so growing the data extracts only the new rows
and the shards still hold what a fresh run writes.

The fast tests check the key, the store (links, the copy across filesystems, damaged entries,
pruning), and the whole stage with the transformers backend; the engine test runs the vLLM
backend against a real server and counts the requests it receives."""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from conftest import default_config

from eaglenest.hidden_states import extract
from eaglenest.hidden_states.extract import FP8, extract_stage, plan_stage
from eaglenest.hidden_states.store import (
    STORE_DIR,
    SampleStore,
    extraction_settings,
    prune,
    settings_key,
    store_root,
    token_key,
)
from eaglenest.planning.run_estimate import hidden_state_bytes

SERVER = {"base_args": ["--dtype", "float32"], "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}, "device": "cpu"}
# What a shard's manifest says of how it was written, not of what it holds.
HOW_WRITTEN = ("seconds", "tokens_per_s", "reused_samples")
NUM_SHARDS = 3


# --- the key ---------------------------------------------------------------------------------


def _fake_target(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"w" * 64)
    return folder


def _key(target, **change) -> str:
    settings = {
        "target": target,
        "aux_layer_ids": [1, 2, 3],
        "num_layers": 6,
        "dtype": "bfloat16",
        "backend": "vllm",
        "server_cfg": SERVER,
    }
    return settings_key(extraction_settings(**{**settings, **change}))


def test_the_key_changes_with_what_decides_a_samples_bytes_and_only_with_that(tmp_path):
    target = _fake_target(tmp_path / "target")
    base = _key(target)
    assert _key(target) == base
    changed = {
        "dtype": _key(target, dtype=FP8),
        "layers": _key(target, aux_layer_ids=[1, 3, 4]),
        "backend": _key(target, backend="transformers"),
        "serving flags": _key(target, server_cfg={**SERVER, "base_args": ["--dtype", "bfloat16"]}),
        "engine variables": _key(target, server_cfg={**SERVER, "env": {}}),
        "device": _key(target, server_cfg={**SERVER, "device": "cuda"}),
    }
    weights = target / "model.safetensors"
    st = weights.stat()
    weights.write_bytes(b"v" * 64)  # rewritten, the same size
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    changed["target weights"] = _key(target)
    assert len({base, *changed.values()}) == len(changed) + 1, changed
    # Settings that decide nothing of the bytes: the server's lease and timeouts; for the
    # transformers backend, vLLM's flags.
    same_server = {**SERVER, "reuse": False, "stall_timeout_s": 5, "startup_timeout_s": 9}
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _key(target, server_cfg=same_server) == base
    assert _key(target, backend="transformers", server_cfg={}) == changed["backend"]
    # The target's folder copied with its files' times (a moved checkout) is the same target.
    shutil.copytree(target, tmp_path / "moved", copy_function=shutil.copy2)
    assert _key(tmp_path / "moved") == base


def test_the_token_key_is_the_token_ids():
    assert token_key([1, 2, 3]) == token_key((1, 2, 3)) == token_key(torch.tensor([1, 2, 3]).tolist())
    assert len({token_key([1, 2, 3]), token_key([1, 2]), token_key([12, 3]), token_key([1, 23])}) == 4


# --- the store -------------------------------------------------------------------------------


def _sample(path: Path, ids: list[int]) -> dict:
    """A sample file as extraction writes it, and the record the store keeps."""
    record = extract._save(path, torch.randn(len(ids), 4, 8), torch.tensor(ids), "bfloat16")
    return {**record, "tokens": len(ids)}


def _kept(tmp_path, store: SampleStore, ids: list[int], name: str) -> tuple[Path, dict]:
    shard = tmp_path / "shard"
    shard.mkdir(exist_ok=True)
    record = _sample(shard / name, ids)
    store.keep(ids, shard / name, record)
    return shard / name, record


def test_a_kept_sample_is_a_hard_link_and_is_linked_back_into_a_shard(tmp_path):
    store = SampleStore(tmp_path / "run", {"what": "settings"})
    ids = [5, 6, 7]
    path, record = _kept(tmp_path, store, ids, "hs_0.safetensors")
    assert path.stat().st_nlink == 2  # the shard's file and the store's: one copy on disk
    rows = [(0, {"input_ids": ids}), (1, {"input_ids": [5, 6]})]
    assert store.lookup(rows) == {0: record}
    dest = tmp_path / "new_shard" / "hs_9.safetensors"
    dest.parent.mkdir()
    store.link(ids, dest)
    assert dest.stat().st_ino == path.stat().st_ino
    assert json.loads((store.folder / "settings.json").read_text()) == {"what": "settings"}
    # The same tokens again (a duplicate row): the first entry stays.
    other = tmp_path / "shard" / "hs_1.safetensors"
    store.keep(ids, other, _sample(other, ids))
    assert store.lookup(rows) == {0: record} and other.stat().st_nlink == 1


def test_across_filesystems_a_sample_is_copied_into_the_shard_and_the_store_keeps_nothing(
    tmp_path, monkeypatch, caplog
):
    store = SampleStore(tmp_path / "run", {})
    path, _ = _kept(tmp_path, store, [1, 2, 3], "hs_0.safetensors")

    def cross_device(src, dst):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(src), None, str(dst))

    monkeypatch.setattr(os, "link", cross_device)
    dest = tmp_path / "elsewhere" / "hs_0.safetensors"
    dest.parent.mkdir()
    store.link([1, 2, 3], dest)
    assert dest.read_bytes() == path.read_bytes() and dest.stat().st_ino != path.stat().st_ino
    with caplog.at_level(logging.WARNING, logger="eaglenest.hidden_states.store"):
        _kept(tmp_path, store, [4, 5], "hs_1.safetensors")
        _kept(tmp_path, store, [6, 7], "hs_2.safetensors")
    assert store.lookup([(1, {"input_ids": [4, 5]}), (2, {"input_ids": [6, 7]})]) == {}
    assert [r.message for r in caplog.records if "samples are not kept" in r.message] != []
    assert len(caplog.records) == 1  # said once
    assert not list(store.folder.rglob(".*tmp-*"))  # no temporary entry left behind


def test_a_damaged_entry_is_dropped_and_its_row_extracted_again(tmp_path):
    store = SampleStore(tmp_path / "run", {})
    path, _ = _kept(tmp_path, store, [1, 2, 3], "hs_0.safetensors")
    path.unlink()  # the shard rebuilt; the store's link alone holds the sample
    (entry,) = store.folder.glob("*/*")
    stored = entry / "hs.safetensors"
    stored.write_bytes(stored.read_bytes()[:-10])  # cut short
    assert store.lookup([(0, {"input_ids": [1, 2, 3]})]) == {}
    assert not entry.exists()


def test_pruning_removes_what_no_shard_holds_whatever_its_settings(tmp_path):
    run = tmp_path / "run"
    current, other = SampleStore(run, {"dtype": "bfloat16"}), SampleStore(run, {"dtype": FP8})
    held, _ = _kept(tmp_path, current, [1, 2], "hs_0.safetensors")
    gone = [_kept(tmp_path, current, [3, 4], "hs_1.safetensors")[0]]
    gone.append(_kept(tmp_path, other, [5, 6], "hs_2.safetensors")[0])
    sizes = sum(p.stat().st_size for p in gone)
    for p in gone:
        p.unlink()  # rows taken out of the data, and a shard extracted under other settings
    (current.folder / "ab" / ".0123.tmp-xyz").mkdir(parents=True)  # a killed writer's
    assert prune(run) == {"kept": 1, "removed": 2, "bytes_freed": sizes}
    assert not other.folder.exists()
    assert current.lookup([(0, {"input_ids": [1, 2]}), (1, {"input_ids": [3, 4]})]).keys() == {0}
    assert not (current.folder / "ab").exists()
    assert held.stat().st_nlink == 2


# --- the stage, transformers backend ----------------------------------------------------------


def _rows(n: int, seed: int, vocab: int = 2048) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"id": f"s{seed}-{k}", "input_ids": [rng.randrange(1, vocab) for _ in range(rng.randrange(6, 25))]}
        for k in range(n)
    ]


def grown(rows: list[dict], new: list[dict]) -> list[dict]:
    """`rows` with about 10% more: the new rows spread among the old ones (as new prompts land
    anywhere in the tokenized order), so every shard's bounds move."""
    out = list(rows)
    for k, row in enumerate(new):
        out.insert((k + 1) * len(out) // (len(new) + 1), row)
    return out


def write_tokenized(folder: Path, rows: list[dict]) -> tuple[Path, Path]:
    """tokenized_data.jsonl and metadata.json as tokenize writes them (the fields used here)."""
    folder.mkdir(parents=True, exist_ok=True)
    data, meta = folder / "tokenized_data.jsonl", folder / "metadata.json"
    data.write_text("".join(json.dumps({**r, "loss_mask": [1] * len(r["input_ids"])}) + "\n" for r in rows))
    lengths = [len(r["input_ids"]) for r in rows]
    meta.write_text(
        json.dumps({"tokens_total": sum(lengths), "samples_out": len(rows), "max_seq_len": max(lengths)})
    )
    return data, meta


def plan(run: Path, target, tokenized: tuple[Path, Path], dtype: str, extraction: dict | None, **kw) -> dict:
    return plan_stage(
        metadata_path=tokenized[1],
        target=str(target),
        aux_layer_ids=None,
        out_dir=run / "hidden_states",
        num_shards=NUM_SHARDS,
        dtype=dtype,
        disk_margin_gb=0,
        plan_path=run / "hidden_states" / "plan.json",
        run_dir=run,
        tokenized_path=tokenized[0],
        extraction=extraction,
        **kw,
    )


def extract_all(
    run: Path, target, tokenized: Path, folder: Path, dtype: str, backend: str, server_cfg
) -> list:
    """Every shard, as the extract_hidden_states jobs write them (a job's old shard is deleted
    first, as Snakemake does); their manifests."""
    manifests = []
    for k in range(NUM_SHARDS):
        out = folder / f"shard_{k}"
        shutil.rmtree(out, ignore_errors=True)
        manifests.append(
            extract_stage(
                run_dir=run,
                target=str(target),
                tokenized_path=tokenized,
                plan_path=run / "hidden_states" / "plan.json",
                out_dir=out,
                shard=k,
                num_shards=NUM_SHARDS,
                dtype=dtype,
                backend=backend,
                concurrency=1,
                server_cfg=server_cfg,
            )
        )
    return manifests


def assert_same_shards(ours: Path, fresh: Path) -> None:
    """Every shard the same files, byte for byte, and the same manifest but for its timings and
    reuse count."""
    for k in range(NUM_SHARDS):
        a, b = ours / f"shard_{k}", fresh / f"shard_{k}"
        names = sorted(p.name for p in a.iterdir())
        assert names == sorted(p.name for p in b.iterdir()), k
        for name in names:
            if name != "manifest.json":
                assert (a / name).read_bytes() == (b / name).read_bytes(), f"shard_{k}/{name}"
        ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
        assert {k: v for k, v in ma.items() if k not in HOW_WRITTEN} == {
            k: v for k, v in mb.items() if k not in HOW_WRITTEN
        }


@pytest.mark.parametrize("dtype", ["bfloat16", FP8])
def test_growing_the_data_computes_only_the_new_rows_and_writes_a_fresh_runs_shards(
    tmp_path, untrained_target, monkeypatch, dtype
):
    """The transformers backend, 20 rows then 22 (two new ones among them): the second extraction
    computes the two new rows only and its shards, manifests included (fp8's error per slot
    too), are what a fresh extraction of the 22 rows writes. The plan counts the 20 as needing no
    new disk, and disk usage puts the shards' bytes under hidden_states, not under the store."""
    from eaglenest.report.disk_usage import folder_usage

    computed = []
    real_forward = extract._transformers_forward

    def counting_forward(*args):
        forward = real_forward(*args)
        return lambda ids: computed.append(ids[0].tolist()) or forward(ids)

    monkeypatch.setattr(extract, "_transformers_forward", counting_forward)
    run, extraction = tmp_path / "run", {"backend": "transformers", "server": {}}
    small = _rows(20, seed=1)
    small[13] = {**small[13], "input_ids": small[4]["input_ids"]}  # a duplicate row
    new = _rows(2, seed=2)
    args = (untrained_target, run / "tokenized" / "tokenized_data.jsonl")

    tokenized = write_tokenized(run / "tokenized", small)
    assert "reusable" in plan(run, untrained_target, tokenized, dtype, extraction)
    first = extract_all(run, *args, run / "hidden_states", dtype, "transformers", {})
    # Row 13 repeats row 4's tokens: its shard, after row 4's, takes row 4's sample.
    assert len(computed) == 19 and [m["reused_samples"] for m in first] == [0, 0, 1]

    computed.clear()
    tokenized = write_tokenized(run / "tokenized", grown(small, new))
    # The disk check counts the new rows only: free space for them alone is enough.
    new_bytes = hidden_state_bytes(sum(len(r["input_ids"]) for r in new), 128, dtype)
    monkeypatch.setattr(extract, "free_bytes", lambda _folder: new_bytes)
    planned = plan(run, untrained_target, tokenized, dtype, extraction)
    assert planned["reusable"] == {"samples": 20, "bytes": planned["bytes"] - new_bytes}
    with pytest.raises(Exception, match="not enough disk for hidden states in offline mode"):
        plan(run, untrained_target, tokenized, dtype, None)  # without the store: all of it
    plan(run, untrained_target, tokenized, dtype, extraction)
    monkeypatch.undo()
    monkeypatch.setattr(extract, "_transformers_forward", counting_forward)

    ours = extract_all(run, *args, run / "hidden_states", dtype, "transformers", {})
    assert sorted(computed) == sorted(r["input_ids"] for r in new)
    assert sum(m["reused_samples"] for m in ours) == 20

    usage = {r["path"]: r["bytes"] for r in folder_usage(run)}
    files = [p.stat() for p in (run / "hidden_states").glob("shard_*/hs_*")]
    shard_bytes = sum({(st.st_dev, st.st_ino): st.st_size for st in files}.values())  # the duplicate once
    assert usage["hidden_states"] >= shard_bytes and usage[STORE_DIR] < shard_bytes / 10

    shutil.move(store_root(run), tmp_path / "store-aside")  # a fresh run has none
    extract_all(run, *args, tmp_path / "fresh", dtype, "transformers", {})
    assert_same_shards(run / "hidden_states", tmp_path / "fresh")


def test_a_shard_file_found_damaged_is_dropped_from_the_store_so_its_rebuild_extracts_it(
    tmp_path, untrained_target, monkeypatch
):
    """A flipped byte in a shard's file is a flipped byte in its store link (one inode): the
    shard check drops that sample from the store too, and the rebuild the check names extracts
    it again instead of linking the damaged bytes back."""
    from eaglenest.core.errors import EaglenestError
    from eaglenest.hidden_states.shard_check import verify_shards
    from eaglenest.hidden_states.store import forget

    run, extraction = tmp_path / "run", {"backend": "transformers", "server": {}}
    tokenized = write_tokenized(run / "tokenized", _rows(6, seed=3))
    plan(run, untrained_target, tokenized, "bfloat16", extraction)
    args = (untrained_target, tokenized[0], run / "hidden_states", "bfloat16", "transformers", {})
    extract_all(run, *args)
    bad = run / "hidden_states" / "shard_1" / "hs_3.safetensors"
    data = bytearray(bad.read_bytes())
    data[-1] ^= 0xFF
    with open(bad, "r+b") as f:  # in place, as a failing disk does
        f.write(data)
    shards = sorted((run / "hidden_states").glob("shard_*"))
    with pytest.raises(EaglenestError, match=r"hs_3.safetensors \(shard shard_1\): sha256 differs"):
        verify_shards(
            shards, checksums=True, forget=forget
        )  # as training and `eaglenest verify-shards` call it
    computed = []
    real_forward = extract._transformers_forward
    monkeypatch.setattr(
        extract, "_transformers_forward", lambda *a: lambda ids: computed.append(1) or real_forward(*a)(ids)
    )
    shutil.rmtree(shards[1])
    stats = extract_all(run, *args)  # every shard job, as after `--force`; only row 3 is computed
    assert len(computed) == 1 and [m["reused_samples"] for m in stats] == [2, 1, 2]
    assert verify_shards(shards, checksums=True)["files"] == 6


def test_a_shard_stopped_midway_resumes_from_the_samples_it_finished(tmp_path, untrained_target, monkeypatch):
    """A shard job that fails on its fourth row leaves no shard, but the three rows it finished
    are in the store: its rerun computes the other rows only."""
    run, extraction = tmp_path / "run", {"backend": "transformers", "server": {}}
    tokenized = write_tokenized(run / "tokenized", _rows(18, seed=4))  # 6 rows a shard
    plan(run, untrained_target, tokenized, "bfloat16", extraction)
    computed = []
    real_forward = extract._transformers_forward

    def failing_forward(*args):
        forward = real_forward(*args)

        def once(ids):
            if len(computed) == 3 and not stopped:
                stopped.append(True)
                raise KeyboardInterrupt  # what a stage's SIGTERM handler raises, say
            computed.append(1)
            return forward(ids)

        return once

    stopped = []
    monkeypatch.setattr(extract, "_transformers_forward", failing_forward)
    kw = dict(run_dir=run, target=str(untrained_target), tokenized_path=tokenized[0], dtype="bfloat16",
              plan_path=run / "hidden_states" / "plan.json", num_shards=NUM_SHARDS, backend="transformers",
              concurrency=1, server_cfg={})  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        extract_stage(out_dir=run / "hidden_states" / "shard_0", shard=0, **kw)
    assert not (run / "hidden_states" / "shard_0").exists() and len(computed) == 3
    stats = extract_stage(out_dir=run / "hidden_states" / "shard_0", shard=0, **kw)
    assert len(computed) == 6 and stats["reused_samples"] == 3


# --- the stage, vLLM backend -------------------------------------------------------------------


@pytest.mark.engine
def test_adding_prompts_to_a_finished_run_extracts_only_the_new_samples(
    tmp_path, untrained_target, monkeypatch
):
    """The vLLM backend on the real engine (one CPU server, leased as the workflow's jobs lease
    it): 20 rows extracted, then the same rows with 2 new ones among them. The server receives
    requests for the 2 new rows alone (its own access log counts them), and every shard, byte
    for byte and manifest, is what a fresh extraction of the 22 rows writes."""
    from test_hidden_state_modes import extraction_requests

    from eaglenest.engine.server import WORKFLOW_PID_ENV, Lease
    from eaglenest.pipeline.workflow import vllm_base_args, vllm_env

    monkeypatch.setenv(WORKFLOW_PID_ENV, str(os.getpid()))  # the server ends with this process
    cfg = default_config()
    # No prefix caching: the fresh extraction computes every row again instead of reading the
    # engine's cache of the earlier ones; one request at a time, as the engine's answer is then
    # the same whatever it runs beside.
    cfg["vllm"]["extra_args"] = ["--no-enable-prefix-caching"]
    server_cfg = {
        "base_args": list(vllm_base_args(cfg["vllm"], cfg["target"])),
        "env": dict(vllm_env(cfg["vllm"])),
        "device": "cpu",
        "reuse": True,
        "startup_timeout_s": 600,
        "stall_timeout_s": 300,
    }
    run, dtype = tmp_path / "run", "bfloat16"
    extraction = {"backend": "vllm", "server": server_cfg}
    small, new = _rows(20, seed=1), _rows(2, seed=2)
    args = (untrained_target, run / "tokenized" / "tokenized_data.jsonl")
    try:
        plan(run, untrained_target, write_tokenized(run / "tokenized", small), dtype, extraction)
        first = extract_all(run, *args, run / "hidden_states", dtype, "vllm", server_cfg)
        assert extraction_requests(run) == 20 and sum(m["reused_samples"] for m in first) == 0

        planned = plan(
            run, untrained_target, write_tokenized(run / "tokenized", grown(small, new)), dtype, extraction
        )
        assert planned["reusable"]["samples"] == 20
        ours = extract_all(run, *args, run / "hidden_states", dtype, "vllm", server_cfg)
        assert extraction_requests(run) == 20 + 2
        assert sum(m["reused_samples"] for m in ours) == 20

        shutil.move(store_root(run), tmp_path / "store-aside")  # a fresh run has none
        extract_all(run, *args, tmp_path / "fresh", dtype, "vllm", server_cfg)
        assert extraction_requests(run) == 20 + 2 + 22
        assert_same_shards(run / "hidden_states", tmp_path / "fresh")
        assert Lease(run).count_starts() == 1  # one server for all of it
    finally:
        Lease(run).release()
