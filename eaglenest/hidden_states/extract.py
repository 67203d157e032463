"""Extract the target's hidden states into shards the speculators trainer reads.

Layout: `hidden_states/shard_{k}/hs_{i}.safetensors`, one file per row `i` of
`tokenized_data.jsonl` (global row index), each holding `hidden_states [seq, 4, H]` (the three
auxiliary layers, then the input of the final norm) and `token_ids [seq]` int64: the exact file
format of speculators' `FileTransfer`. Shard `k` of `K` holds one contiguous slice of rows, so
the training stage only has to link the shards' files into one folder.

Two backends write identical files: vLLM (the `extract_hidden_states` speculative method and
the hidden-states KV connector) and a transformers fallback for targets vLLM cannot serve.
Either takes each row whose sample an earlier extraction under the same settings wrote from the
run's sample store (eaglenest.hidden_states.store) and computes only the others.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import logging
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from hs_connectors.fp8_utils import SCALES_KEY, dequantize_fp8_tensor

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import (
    atomic_path,
    bytes_record,
    disk_full,
    free_bytes,
    human_bytes,
    read_json,
    room_for,
    write_json,
)
from eaglenest.draft.aux_layers import resolve_aux_layer_ids
from eaglenest.engine.server import (
    SERVED_NAME,
    Server,
    ServerError,
    ServerSpec,
    StallWatch,
    check_alive,
    serving,
)
from eaglenest.hidden_states import fp8
from eaglenest.hidden_states.store import SampleStore, extraction_settings
from eaglenest.pipeline.workflow import resolve_device
from eaglenest.planning.run_estimate import DTYPE_BYTES, FP8, hidden_state_bytes, peak_disk_by_mode
from eaglenest.target.resolve import read_shape

log = logging.getLogger(__name__)

DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    # hs_connectors' fp8 format: the values beside float32 scales (eaglenest.hidden_states.fp8).
    FP8: torch.float8_e4m3fn,
}


def shard_bounds(num_rows: int, num_shards: int, k: int) -> tuple[int, int]:
    """Rows [start, stop) of shard k: contiguous, sizes differing by at most one."""
    return k * num_rows // num_shards, (k + 1) * num_rows // num_shards


def vllm_extraction_spec(
    target: str,
    aux_layer_ids: list[int],
    num_layers: int,
    spool_dir,
    base_args: tuple[str, ...],
    env: tuple,
    cpu: bool,
    fp8_connector: bool = False,
) -> ServerSpec:
    """The vLLM server that writes hidden states of the aux layers plus the last one, in the
    engine's dtype, or with `fp8_connector` quantized as the trainer reads them over the wire
    (online and hybrid: hs_connectors' FP8 connector, or its CPU twin). Offline extraction
    quantizes in the stage instead (eaglenest.hidden_states.fp8)."""
    spec_cfg = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {
            "hf_config": {"eagle_aux_hidden_state_layer_ids": [*aux_layer_ids, num_layers]}
        },
    }
    kv_cfg = {
        "kv_connector": "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(Path(spool_dir).resolve())},
    }
    if cpu:
        kv_cfg["kv_connector"] = (
            "CpuFP8HiddenStatesConnector" if fp8_connector else "CpuHiddenStatesConnector"
        )
        kv_cfg["kv_connector_module_path"] = "eaglenest.engine.cpu_connector"
    elif fp8_connector:
        kv_cfg["kv_connector"] = "FP8HiddenStatesConnector"
        kv_cfg["kv_connector_module_path"] = "hs_connectors.fp8_hidden_states_connector"
    args = (
        *base_args,
        "--speculative-config",
        json.dumps(spec_cfg),
        "--kv-transfer-config",
        json.dumps(kv_cfg),
    )
    return ServerSpec(model=target, args=args, env=env)


def validate_sample(data: dict, input_ids: list[int], hidden_size: int, where: str) -> None:
    hs, tok = data.get("hidden_states"), data.get("token_ids")
    if hs is not None:
        hs = values_of(data)
    if hs is None or tok is None:
        raise EaglenestError("hidden-state file lacks hidden_states or token_ids", where)
    if tok.tolist() != input_ids:
        raise EaglenestError("token_ids differ from the tokenized row", where)
    if tuple(hs.shape) != (len(input_ids), 4, hidden_size):
        raise EaglenestError(
            f"hidden_states shape {tuple(hs.shape)}, expected ({len(input_ids)}, 4, {hidden_size})", where
        )
    if not torch.isfinite(hs).all():  # in the stored dtype: no float32 copy of the sample
        raise EaglenestError("hidden_states contain NaN or Inf", where)


def values_of(data: dict) -> torch.Tensor:
    """A sample's hidden states as values: fp8 ones dequantized (to float32), others as stored."""
    if SCALES_KEY in data:
        return dequantize_fp8_tensor(data["hidden_states"], data[SCALES_KEY], dtype=torch.float32)
    return data["hidden_states"]


def stored_tensors(
    hidden: torch.Tensor, token_ids: torch.Tensor, dtype: str, tally: fp8.SlotErrorTally | None = None
) -> dict[str, torch.Tensor]:
    """One sample as the trainer's file holds it, in the stored dtype (fp8: hs_connectors'
    format with a scale per token and slot, each slot's error added to `tally`)."""
    tensors = {"token_ids": token_ids.to(torch.int64).contiguous()}
    if dtype == FP8:
        values, scales = fp8.quantize(hidden)
        if tally is not None:
            tally.add(fp8.slot_errors(hidden, values, scales))
        tensors.update(hidden_states=values.contiguous(), **{SCALES_KEY: scales.contiguous()})
    else:
        tensors["hidden_states"] = hidden.to(DTYPES[dtype]).contiguous()
    return tensors


def in_stored_format(data: dict, dtype: str) -> bool:
    """Whether a file the engine wrote already is what a shard stores (then it is moved)."""
    return (
        data["hidden_states"].dtype == DTYPES[dtype]
        and data["token_ids"].dtype == torch.int64
        and (SCALES_KEY in data) == (dtype == FP8)
    )


def _save(path: Path, hidden: torch.Tensor, token_ids: torch.Tensor, dtype: str) -> dict:
    """Write one sample in the stored dtype; return its record: size and sha256 (taken from the
    bytes written rather than by reading the file back) and, fp8, its error per slot."""
    from safetensors.torch import save

    errors = fp8.SlotErrorTally()
    data = save(stored_tensors(hidden, token_ids, dtype, errors))
    path.write_bytes(data)
    return {**bytes_record(data), "fp8_error": errors.state()}


def read_rows(tokenized_path, start: int, stop: int) -> list[tuple[int, dict]]:
    """Rows [start, stop) of the tokenized data: lines before `start` are skipped unparsed and
    reading stops at `stop`, so a shard costs its own rows, not the whole file."""
    rows = []
    with open(tokenized_path, encoding="utf-8") as f:
        for i, line in enumerate(itertools.islice(f, start, stop), start=start):
            try:
                rows.append((i, json.loads(line)))
            except json.JSONDecodeError as e:
                raise EaglenestError(f"line {i + 1}: malformed JSON ({e.msg})", tokenized_path) from None
    if len(rows) != stop - start:
        raise EaglenestError(
            f"has {start + len(rows)} rows, the plan expects at least {stop}: rerun plan_hidden_states",
            tokenized_path,
        )
    return rows


def _hidden_states_requester(server: Server, concurrency: int, stall_timeout_s: float):
    """A `request(i, row)` that has the server extract a row and returns the path of the file it wrote."""
    import openai
    from speculators.data_generation.vllm_client import generate_hidden_states

    # A shard must be whole: a request that fails twice, or a server silent for
    # stall_timeout_s (hung), fails the job; the finished shards stay.
    client = openai.OpenAI(
        base_url=server.api_url, api_key=server.client_key, max_retries=1, timeout=stall_timeout_s
    )
    watch = StallWatch(server, stall_timeout_s)
    in_engine = threading.BoundedSemaphore(concurrency)

    def request(i: int, row: dict) -> str:
        ids = row["input_ids"]
        try:
            with in_engine:
                _handle, params = generate_hidden_states(
                    client, SERVED_NAME, {"input_ids": ids}, timeout=stall_timeout_s
                )
        except openai.APIError as e:
            watch.check(e)
            raise ServerError(
                f"row {i} (id {row['id']}): the server failed it twice: {e}", server.log_path
            ) from e
        watch.answered()
        return params["hidden_states_path"]

    return request


def _store_engine_file(
    path: str, dest: Path, item: tuple[int, dict], *, tokenized_path, hidden_size: int, dtype: str
) -> dict:
    """Check row `item`'s engine file at `path` and store it at `dest`: return its record."""
    from safetensors.torch import load as load_bytes

    i, row = item
    raw = _engine_file_bytes(path)
    data = load_bytes(raw)
    validate_sample(data, row["input_ids"], hidden_size, f"{tokenized_path} row {i} (id {row['id']})")
    if in_stored_format(data, dtype):
        shutil.move(path, dest)
        return {**bytes_record(raw), "fp8_error": None}
    record = _save(dest, values_of(data), data["token_ids"], dtype)
    os.remove(path)
    return record


def _fill_shard(
    out_dir, rows: tuple[int, int], items, make, *, hidden_size: int, dtype: str, meta: dict,
    store: SampleStore | None = None, found: dict | None = None, threads: int = 1,
) -> dict:  # fmt: skip
    """Write the shard of rows `rows` [start, stop) at `out_dir`, whole or not at all, from
    `items`: (row index, token ids, what `make` takes) each. A row in `found` (its record, from
    `store.lookup`) is linked from the store; `make(x, dest)` writes every other one at `dest`
    and returns its record, which the store then keeps. `threads` rows at a time (1: in this
    thread). The manifest records each file and how many samples came from the store."""
    found = found or {}
    t0 = time.monotonic()
    tally = fp8.SlotErrorTally()

    def one(item, tmp: Path):
        i, ids, x = item
        dest = tmp / f"hs_{i}.safetensors"
        if i in found:
            store.link(ids, dest)
            record = found[i]
        else:
            record = make(x, dest)
            if store is not None:
                store.keep(ids, dest, {**record, "tokens": len(ids)})
        tally.add_state(record["fp8_error"])
        return dest.name, len(ids), i in found, {k: record[k] for k in ("bytes", "sha256")}

    with atomic_path(out_dir, is_dir=True) as tmp:
        pool = ThreadPoolExecutor(threads) if threads > 1 else None
        try:
            done = list((pool.map if pool else map)(lambda it: one(it, tmp), items))
        finally:  # on a failure, fail now: queued rows are dropped (not sent to a hung server)
            if pool:
                pool.shutdown(wait=False, cancel_futures=True)
        return _write_manifest(tmp, rows, done, hidden_size, dtype, meta, time.monotonic() - t0, tally)


def extract_shard_vllm(
    server: Server,
    tokenized_path,
    out_dir,
    *,
    num_rows: int,
    shard: int,
    num_shards: int,
    hidden_size: int,
    dtype: str,
    meta: dict,
    concurrency: int = 4,
    stall_timeout_s: float = 1800.0,
    store: SampleStore | None = None,
) -> dict:
    """Write shard `shard` of `num_shards` (of `num_rows` rows) through a running extraction
    server, asking it only for the rows `store` does not hold."""
    bounds = shard_bounds(num_rows, num_shards, shard)
    rows = read_rows(tokenized_path, *bounds)
    found = store.lookup(rows) if store is not None else {}
    return _vllm_shard(
        server, tokenized_path, out_dir, bounds, rows, found, store=store, hidden_size=hidden_size,
        dtype=dtype, meta=meta, concurrency=concurrency, stall_timeout_s=stall_timeout_s,
    )  # fmt: skip


def _vllm_shard(
    server: Server | None, tokenized_path, out_dir, bounds, rows, found, *, store, hidden_size, dtype,
    meta, concurrency, stall_timeout_s,
) -> dict:  # fmt: skip
    """The vLLM backend's shard of rows `bounds` (`rows`, of which the store holds `found`;
    `server`: None when it holds every one). The engine's file already has the trainer's format:
    where it is in the stored dtype it is moved into the shard (a rename), else converted once.

    `concurrency` bounds the requests in the engine, not the file work: a row's file is read,
    checked and stored after its request slot is freed, so the engine gets its next row while
    the client writes. Each file is read once (its checksum taken from the bytes in hand)."""
    import openai

    request = _hidden_states_requester(server, concurrency, stall_timeout_s) if server else None

    def make(item, dest: Path) -> dict:
        path = request(*item)
        return _store_engine_file(
            path, dest, item, tokenized_path=tokenized_path, hidden_size=hidden_size, dtype=dtype
        )

    items = [(i, row["input_ids"], (i, row)) for i, row in rows]
    try:
        # Twice the request slots: while `concurrency` rows are in the engine, as many finished
        # ones can be stored.
        return _fill_shard(
            out_dir, bounds, items, make, hidden_size=hidden_size, dtype=dtype, meta=meta, store=store,
            found=found, threads=2 * concurrency,
        )  # fmt: skip
    except openai.APIError:
        check_alive(server)
        raise


def _engine_file_bytes(path: str) -> bytes:
    """The bytes of a file the engine's connector wrote, once its write is complete; its lock
    file is removed. (vLLM's `load_hidden_states` waits the same way, but parses the file from
    disk, and the manifest's checksum would then read it a second time.)"""

    lock_path = path + ".lock"
    with open(lock_path) as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # the connector holds LOCK_EX until the file is whole
        data = Path(path).read_bytes()
    os.remove(lock_path)
    return data


def _write_manifest(
    tmp: Path, rows: tuple[int, int], done: list, hidden_size, dtype, meta, seconds, tally: fp8.SlotErrorTally
) -> dict:
    """The shard's record: `done` lists each file's name, tokens, whether it came from the sample
    store, and its size and sha256 (shard_check); `tokens_per_s` counts the samples extracted
    here. An fp8 shard records each slot's error and is refused (nothing stored) where it is
    too large."""
    start, stop = rows
    if problem := tally.problem():
        raise EaglenestError(f"shard {meta['shard']} (rows {start}..{stop}): {problem}", tmp.parent)
    tokens = sum(n for _, n, _, _ in done)
    extracted = sum(n for _, n, reused, _ in done if not reused)
    reused = sum(1 for _, _, r, _ in done if r)
    stats = {
        "rows": [start, stop],
        "samples": stop - start,
        "tokens": tokens,
        "hidden_size": hidden_size,
        "dtype": dtype,
        "bytes": hidden_state_bytes(tokens, hidden_size, dtype),
        "seconds": round(seconds, 3),
        "tokens_per_s": round(extracted / seconds, 1) if seconds > 0 and extracted else None,
        **meta,
        "reused_samples": reused,
        "fp8_error": tally.summary(),
        "files": {name: record for name, _, _, record in done},  # in row order, as `items` came
    }
    (tmp / "manifest.json").write_text(json.dumps(stats, indent=2) + "\n")
    log.info(
        "shard rows %d..%d: %d tokens in %.1f s; %d of %d samples extracted, %d reused from the sample store",
        start, stop, tokens, seconds, len(done) - reused, len(done), reused,
    )  # fmt: skip
    return stats


def extract_shard_transformers(
    target: str,
    tokenized_path,
    out_dir,
    *,
    num_rows: int,
    shard: int,
    num_shards: int,
    aux_layer_ids: list[int],
    dtype: str,
    meta: dict,
    trust_remote_code: bool = False,
    store: SampleStore | None = None,
) -> dict:
    """The fallback backend: same files, computed with transformers on the local device, for the
    rows `store` does not hold (the model is loaded only where there is one).

    Slot 3 is the input of the final norm (the last decoder layer's output), as vLLM writes it,
    not transformers' `hidden_states[-1]` (which is after the norm); a hook captures it.
    """
    shape = read_shape(target)
    if shape.multimodal:
        # AutoModelForCausalLM rejects multimodal wrappers (Kimi-K2.5), and their final norm
        # sits elsewhere: the engine's own extraction handles them.
        raise EaglenestError(
            f"the transformers backend loads plain causal LMs; this target is "
            f"multimodal ({', '.join(shape.architectures) or shape.model_type}): "
            "set hidden_states.backend: vllm",
            Path(target) / "config.json",
        )
    bounds = shard_bounds(num_rows, num_shards, shard)
    rows = read_rows(tokenized_path, *bounds)
    found = store.lookup(rows) if store is not None else {}
    forward = (
        _transformers_forward(target, aux_layer_ids, trust_remote_code) if len(found) < len(rows) else None
    )

    def make(item, dest: Path) -> dict:
        i, row = item
        ids = torch.tensor([row["input_ids"]])
        hidden = forward(ids)
        validate_sample(
            {"hidden_states": hidden, "token_ids": ids[0]},
            row["input_ids"],
            shape.hidden_size,
            f"{tokenized_path} row {i}",
        )
        return _save(dest, hidden, ids[0], dtype)

    items = [(i, row["input_ids"], (i, row)) for i, row in rows]
    with torch.inference_mode():
        return _fill_shard(
            out_dir, bounds, items, make, hidden_size=shape.hidden_size, dtype=dtype, meta=meta,
            store=store, found=found,
        )  # fmt: skip


def _transformers_forward(target: str, aux_layer_ids: list[int], trust_remote_code: bool):
    """The target loaded with transformers, as `forward(ids [1, seq]) -> hidden states [seq, 4, H]`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        target, dtype=torch.float32, trust_remote_code=trust_remote_code
    ).eval()
    captured = {}
    model.model.norm.register_forward_hook(
        lambda _m, inputs, _out: captured.__setitem__("pre_norm", inputs[0])
    )

    def forward(ids: torch.Tensor) -> torch.Tensor:
        out = model(ids, output_hidden_states=True)
        layers = [out.hidden_states[j][0] for j in aux_layer_ids] + [captured["pre_norm"][0]]
        return torch.stack(layers, dim=1)

    return forward


def write_shard(out_dir, samples, *, rows: tuple[int, int], hidden_size: int, dtype: str, meta: dict) -> dict:
    """Store `samples` (row index, hidden states [seq, 4, H], token ids) as the shard of `rows`
    [start, stop): each file in the stored dtype, then the manifest. Nothing is at `out_dir`
    unless every sample was written (and, fp8, no slot's error is past the limit)."""
    items = ((i, token_ids, (hidden, token_ids)) for i, hidden, token_ids in samples)
    return _fill_shard(
        out_dir,
        rows,
        items,
        lambda x, dest: _save(dest, *x, dtype),
        hidden_size=hidden_size,
        dtype=dtype,
        meta=meta,
    )


def check_free_space(out_dir, needed: int, margin_bytes: int, mode: str, peaks: dict, dtype: str) -> None:
    """Refuse a plan whose peak hidden-state bytes (in `mode`) and the margin do not fit, naming
    the ways out: the modes that store less and the fp8 saving."""
    out_dir = Path(out_dir)
    free = free_bytes(out_dir)
    if free >= needed + margin_bytes:
        return
    ways = []
    if mode != "online":
        ways.append(
            f"hidden_states.mode: online (nothing stored: about {human_bytes(peaks['online'])} in flight; "
            "training extracts every epoch again from the run's server)"
        )
    if mode == "offline":
        ways.append(
            "hidden_states.mode: hybrid (the first epoch extracts while training and keeps what it "
            "extracted: the same bytes, written during training, no extraction stage)"
        )
    if dtype != FP8:
        half = needed * DTYPE_BYTES[FP8] // DTYPE_BYTES[dtype]
        ways.append(
            f"hidden_states.dtype: {FP8} (about {human_bytes(half)}: fp8 values and their float32 scales)"
        )
    raise EaglenestError(
        f"not enough disk for hidden states in {mode} mode: need {needed / 1e9:.2f} GB + "
        f"{margin_bytes / 1e9:.2f} GB margin, {free / 1e9:.2f} GB free. "
        + (
            "Ways out: " + "; or ".join(ways) + "."
            if ways
            else "Free disk or lower hidden_states.disk_margin_gb."
        ),
        out_dir,
    )


def plan_stage(
    *,
    metadata_path,
    target: str,
    aux_layer_ids,
    out_dir,
    num_shards: int,
    dtype: str,
    disk_margin_gb: float,
    plan_path,
    mode: str = "offline",
    data_loaders: int = 1,
    run_dir=None,
    tokenized_path=None,
    extraction: dict | None = None,
) -> dict:
    """The `plan_hidden_states` rule: fix the layers to extract, state the bytes each mode will
    keep on disk at its peak, and refuse if the chosen mode's peak and the margin do not fit.
    Offline, with the `extraction` settings (backend, server params) of a run (`run_dir`), the
    samples of `tokenized_path` its sample store holds need no new disk: the check counts the
    others only."""

    meta = read_json(metadata_path)
    shape = read_shape(target)
    n, hidden = shape.num_layers, shape.hidden_size
    aux = resolve_aux_layer_ids(aux_layer_ids, n, Path(target) / "config.json")
    tokens = int(meta["tokens_total"])
    total = hidden_state_bytes(tokens, hidden, dtype)
    peaks = peak_disk_by_mode(
        total, hidden_state_bytes(int(meta["max_seq_len"]), hidden, dtype), data_loaders
    )
    plan = {
        "samples": meta["samples_out"],
        "tokens": tokens,
        "hidden_size": hidden,
        "target_num_layers": n,
        "aux_layer_ids": aux,
        "dtype": dtype,
        "num_shards": num_shards,
        "bytes": total,
        "mode": mode,
        "peak_disk_bytes": peaks,
        "disk_margin_gb": disk_margin_gb,
    }
    log.info(
        "hidden states of %d tokens (4 x %d x %s): %s. Peak on disk per mode: %s (%s chosen)",
        tokens,
        hidden,
        dtype,
        human_bytes(total),
        ", ".join(f"{m} {human_bytes(b)}" for m, b in peaks.items()),
        mode,
    )
    needed = peaks[mode]
    if mode == "offline" and extraction is not None:
        plan["reusable"] = _reusable(run_dir, target, plan, tokenized_path, extraction)
        needed -= plan["reusable"]["bytes"]
    check_free_space(out_dir, needed, int(disk_margin_gb * 1e9), mode, peaks, dtype)
    write_json(plan_path, plan)
    return plan


def _reusable(run_dir, target: str, plan: dict, tokenized_path, extraction: dict) -> dict:
    """The samples of the tokenized rows that the run's sample store already holds, and their bytes.
    (The device in the key is resolved where the plan runs: with `vllm.device: auto` and the plan
    on another kind of node than extraction, none are counted, which only over-states the need.)"""
    dtype, backend = plan["dtype"], extraction["backend"]
    store = sample_store(run_dir, target, plan, dtype, backend, extraction["server"])
    rows = read_rows(tokenized_path, 0, plan["samples"]) if store.folder.is_dir() else []
    found = store.lookup(rows)
    tokens = sum(len(row["input_ids"]) for i, row in rows if i in found)
    reusable = {"samples": len(found), "bytes": hidden_state_bytes(tokens, plan["hidden_size"], dtype)}
    log.info(
        "sample store %s holds %d of the %d samples (%s): extraction writes the other %d",
        store.key, len(found), plan["samples"], human_bytes(reusable["bytes"]), plan["samples"] - len(found),
    )  # fmt: skip
    return reusable


def extract_stage(
    *,
    run_dir,
    target: str,
    tokenized_path,
    plan_path,
    out_dir,
    shard: int,
    num_shards: int,
    dtype: str,
    backend: str,
    concurrency: int,
    server_cfg: dict,
    trust_remote_code: bool = False,
) -> dict:
    """The `extract_hidden_states` rule for one shard."""

    plan = read_json(plan_path)
    # A full disk during extraction: ours shows as an OSError; the engine's (it writes each
    # sample into the spool first) as requests that fail. Either way the shard is left out whole.
    folder, needed = Path(out_dir).parent, plan["bytes"] // num_shards
    with room_for(folder, needed, f"hidden-state shard {shard}"):
        try:
            return _extract(
                run_dir, target, tokenized_path, out_dir, plan, shard, num_shards, dtype, backend,
                concurrency, server_cfg, trust_remote_code,
            )  # fmt: skip
        except ServerError as e:
            if free_bytes(folder) < needed:
                raise disk_full(folder, needed, f"hidden-state shard {shard}") from e
            raise


def spool_dir(run_dir) -> Path:
    """Where the extraction server's connector writes each sample before it is moved into a
    shard (offline) or loaded and deleted by the trainer (online)."""
    return Path(run_dir) / ".eaglenest" / "hidden_states_spool"


def extraction_server_spec(
    run_dir,
    target: str,
    plan: dict,
    server_cfg: dict,
    dtype: str,
    visible_gpus: str | None = None,
    *,
    online: bool = False,
    gpu_memory_utilization: float | None = None,
) -> ServerSpec:
    """The run's extraction server, from the plan and a rule's server params: the same spec for
    extract_hidden_states and, `online`, train_draft (`visible_gpus`: its share of the GPUs).
    Offline fp8 the engine writes its own dtype and the stage quantizes, per slot, measuring
    the error (eaglenest.hidden_states.fp8); online the trainer reads the engine's fp8 files.
    `gpu_memory_utilization`: the share of its GPU the server may take, after vllm.extra_args
    (vLLM reads the last), where the trainer shares that GPU."""
    env = dict(server_cfg["env"])
    if visible_gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_gpus
    base_args = tuple(server_cfg["base_args"])
    if gpu_memory_utilization is not None:
        base_args += ("--gpu-memory-utilization", str(gpu_memory_utilization))
    return vllm_extraction_spec(
        target,
        plan["aux_layer_ids"],
        plan["target_num_layers"],
        spool_dir(run_dir),
        base_args,
        tuple(sorted(env.items())),
        cpu=resolve_device(server_cfg["device"]) == "cpu",
        fp8_connector=online and dtype == FP8,
    )


def _extract(
    run_dir, target, tokenized_path, out_dir, plan, shard, num_shards, dtype, backend, concurrency, server_cfg,
    trust_remote_code,
) -> dict:  # fmt: skip

    aux, hidden = plan["aux_layer_ids"], plan["hidden_size"]
    meta = {"aux_layer_ids": aux, "backend": backend, "shard": shard, "num_shards": num_shards}
    store = sample_store(run_dir, target, plan, dtype, backend, server_cfg)
    if backend == "transformers":
        return extract_shard_transformers(
            target,
            tokenized_path,
            out_dir,
            num_rows=plan["samples"],
            shard=shard,
            num_shards=num_shards,
            aux_layer_ids=aux,
            dtype=dtype,
            meta=meta,
            trust_remote_code=trust_remote_code,
            store=store,
        )
    bounds = shard_bounds(plan["samples"], num_shards, shard)
    rows = read_rows(tokenized_path, *bounds)
    found = store.lookup(rows)
    kw = dict(store=store, hidden_size=hidden, dtype=dtype, meta=meta, concurrency=concurrency,
              stall_timeout_s=server_cfg["stall_timeout_s"])  # fmt: skip
    if len(found) == len(rows):  # nothing to ask the engine: no server is started
        return _vllm_shard(None, tokenized_path, out_dir, bounds, rows, found, **kw)
    spec = extraction_server_spec(run_dir, target, plan, server_cfg, dtype)
    with serving(
        spec, run_dir, reuse=server_cfg["reuse"], timeout_s=server_cfg["startup_timeout_s"]
    ) as server:
        return _vllm_shard(server, tokenized_path, out_dir, bounds, rows, found, **kw)


def sample_store(run_dir, target: str, plan: dict, dtype: str, backend: str, server_cfg: dict) -> SampleStore:
    """The run's store of samples extracted under these settings (eaglenest.hidden_states.store)."""
    settings = extraction_settings(
        target=target,
        aux_layer_ids=plan["aux_layer_ids"],
        num_layers=plan["target_num_layers"],
        dtype=dtype,
        backend=backend,
        server_cfg=server_cfg,
    )
    return SampleStore(run_dir, settings)
