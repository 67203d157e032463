"""What a run will need before it runs: the hidden-state bytes, the target's download and GPU
memory. Reads the config and the local disk only (no model, no server, no network)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import free_bytes
from eaglenest.target.resolve import cache_status, is_pinned, on_hub, read_shape

FP8 = "float8_e4m3fn"  # hs_connectors' fp8 format: 8-bit values beside float32 scales
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, FP8: 1}
HIDDEN_LAYERS_STORED = 4  # three auxiliary layers and the final one, per token
#: Offline extraction stores a float32 scale per token and slot (eaglenest.hidden_states.fp8);
#: the engine's connector, online, one per token.
FP8_SCALE_BYTES = 4 * HIDDEN_LAYERS_STORED
MODES = ("offline", "online", "hybrid")
#: hidden_states.shared_gpu_server_memory's default (the schema's): online on one GPU, the share
#: of its memory the extraction server may take, leaving the rest to the trainer.
SHARED_GPU_SERVER_MEMORY = 0.5


def hidden_state_bytes(num_tokens: int, hidden_size: int, dtype: str) -> int:
    """Bytes the shards take: every token stores HIDDEN_LAYERS_STORED x hidden_size values
    (and, in fp8, its scale)."""
    per_token = HIDDEN_LAYERS_STORED * hidden_size * DTYPE_BYTES[dtype]
    if dtype == FP8:
        per_token += FP8_SCALE_BYTES
    return num_tokens * per_token


def shares_one_gpu(gpus: int, server_gpus: int | None) -> bool:
    """Whether online and hybrid training run the server and the trainer on one GPU."""
    return gpus == 1 and server_gpus in (None, 1)


def split_gpus(gpus: int, server_gpus: int | None) -> tuple[int, int]:
    """(server, trainer) GPUs of a GPU rule's `gpus` when training reads hidden states from the
    run's server (online, hybrid). One GPU is shared by both; else the server takes
    `server_gpus` (null: half, rounded up) and the trainer's ranks the rest."""
    if shares_one_gpu(gpus, server_gpus):
        return 1, 1
    server = server_gpus if server_gpus is not None else (gpus + 1) // 2
    if server >= gpus:
        raise EaglenestError(
            f"hidden_states.server_gpus is {server} of gpus {gpus}: leave at least one GPU "
            "for the trainer (online and hybrid modes split the rule's GPUs between the two)"
        )
    return server, gpus - server


def job_gpus(gpus: int) -> list[str]:
    """The GPUs a GPU job uses, as CUDA_VISIBLE_DEVICES names them (as torch counts them when it
    is unset): the first `gpus`. Fewer than `gpus` is an error before a rank or server starts:
    torchrun would start `gpus` ranks and the ones without a GPU die mid-launch."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        devices, seen = [d.strip() for d in given.split(",") if d.strip()], f"CUDA_VISIBLE_DEVICES={given!r}"
    else:
        import torch  # only on a GPU job's path, never when planning

        devices, seen = [str(i) for i in range(torch.cuda.device_count())], "torch.cuda.device_count()"
    if len(devices) < gpus:
        raise EaglenestError(
            f"config gpus is {gpus}, but this job sees {len(devices)} GPU(s) ({seen}): set gpus to "
            f"the GPUs of the node (every GPU rule declares it), or run on a node with {gpus}"
        )
    return devices[:gpus]


def data_loaders(cfg: dict) -> int:
    """Processes that each hold one sample's hidden states at a time while training online:
    one per trainer rank and data-loader worker (see eaglenest.hidden_states.online)."""
    ranks = 1
    if cfg.get("vllm", {}).get("device") != "cpu" and "gpus" in cfg:
        ranks = split_gpus(int(cfg["gpus"]), cfg.get("hidden_states", {}).get("server_gpus"))[1]
    return ranks * max(1, int(cfg.get("train", {}).get("num_workers", 0) or 0))


def peak_disk_by_mode(total_bytes: int | None, sample_bytes: int | None, loaders: int) -> dict:
    """Peak hidden-state bytes on disk in each mode: offline stores every sample before
    training; hybrid stores them too, while the first epoch trains; online holds only what is
    in flight, one sample (at most `sample_bytes`) per data-loader process."""
    online = sample_bytes * loaders if sample_bytes is not None else None
    return {"offline": total_bytes, "online": online, "hybrid": total_bytes}


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _count_lines(path: Path) -> int | None:
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return None


def _local_target_folder(cfg: dict, workdir: Path) -> Path | None:
    """The target's folder on this machine without network: a local folder, or the cached
    snapshot of a hub id (None when neither exists yet)."""
    target = cfg.get("target", {})
    name = str(target.get("path", ""))
    if _on_hub(target, workdir):
        status = cache_status(name, target.get("revision"), _cache_dir(target, workdir))
        return Path(status["snapshot"]) if status["cached"] else None
    path = Path(name) if Path(name).is_absolute() else workdir / name
    return path if (path / "config.json").exists() else None


def _on_hub(target: dict, workdir: Path) -> bool:
    """The workflow's own test (rules/common.smk), with paths relative to `workdir`."""
    name, tiny = str(target.get("path", "")), target.get("build_tiny")
    built_as = (tiny.get("architecture") or "llama") if isinstance(tiny, dict) else None
    return on_hub(name, built_as) and (built_as is not None or not (workdir / name).exists())


def _cache_dir(target: dict, workdir: Path):
    cache = target.get("cache_dir")
    if not cache:
        return None
    return Path(cache) if Path(cache).is_absolute() else workdir / cache


def _hidden_size(cfg: dict, workdir: Path) -> tuple[int | None, str]:
    target = cfg.get("target", {})
    if target.get("hidden_size"):
        return int(target["hidden_size"]), "target.hidden_size"
    tiny = target.get("build_tiny")
    if isinstance(tiny, dict) and tiny.get("hidden_size"):
        return int(tiny["hidden_size"]), "target.build_tiny.hidden_size"
    folder = _local_target_folder(cfg, workdir)
    if folder is not None:
        try:
            return read_shape(folder).hidden_size, f"{folder / 'config.json'}"
        except EaglenestError:
            pass
    return None, "unknown: set target.hidden_size"


def target_status(cfg: dict, workdir=".") -> dict:
    """Where the target comes from, whether it is here already, its weight bytes, and whether
    those fit the GPUs the config asks for. Reads the local disk only."""
    workdir = Path(workdir)
    target = cfg.get("target", {})
    name = str(target.get("path", ""))
    out: dict = {"name": name, "revision": target.get("revision")}
    built = bool(target.get("build_tiny"))
    if _on_hub(target, workdir):
        status = cache_status(name, target.get("revision"), _cache_dir(target, workdir))
        out.update(source="hub", built_here=built, **status)
        if not status["cached"]:
            out["bytes"] = int(target["weights_gb"] * 1e9) if target.get("weights_gb") else None
            out["bytes_from"] = "target.weights_gb" if target.get("weights_gb") else "unknown"
            if not built:  # download_target's own check, with the estimate for the listing
                out["download_room"] = {
                    "free_bytes": free_bytes(status["cache_dir"]),
                    "margin_bytes": disk_margin_bytes(cfg),
                }
        out["remote_code"] = remote_code_plan(target, built, status["commit"])
    elif built:
        out.update(source="built by the workflow", cached=None, bytes=None)
    else:
        folder = _local_target_folder(cfg, workdir)
        out.update(
            source="local folder",
            cached=folder is not None,
            bytes=sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder else None,
        )
    out["gpu_memory"] = gpu_memory_check(cfg, out.get("bytes"))
    return out


def disk_margin_bytes(cfg: dict) -> int:
    """hidden_states.disk_margin_gb in bytes: the free disk a run leaves beside the hidden
    states and beside a target's download."""
    return int(float(cfg.get("hidden_states", {}).get("disk_margin_gb", 0) or 0) * 1e9)


def remote_code_plan(target: dict, built: bool, cached_commit: str | None) -> str | None:
    """What the run will do with a hub target's remote code, in words (None: it runs none)."""
    if not target.get("trust_remote_code"):
        return None
    revision = target.get("revision")
    if built:
        return "the workflow's own (built from the repository's files), hashed into target.json"
    if is_pinned(revision):
        return f"pinned to commit {revision}, hashed into target.json"
    if target.get("allow_unpinned_remote_code"):
        return (
            f"follows {revision or 'main'} (target.allow_unpinned_remote_code: true): whatever the "
            "hub serves there when it is downloaded, hashed into target.json"
        )
    if cached_commit:  # the workflow refuses to plan this; said here for completeness
        return f"NOT pinned: set target.revision: {cached_commit} (the commit the cache holds)"
    return (
        f"NOT pinned (target.revision: {revision or 'null'}): download_target will stop before "
        "fetching, naming the commit to set as target.revision"
    )


#: vLLM 0.32 runs its V2 model runner on GPUs where Triton is present and the V1 runner on
#: CPU (the path the CPU tests exercise); this variable picks the V1 runner on a GPU as well.
GPU_ENGINE_FALLBACK = "VLLM_USE_V2_MODEL_RUNNER=0"


COMMON_GPUS = (("an 80 GB H100/A100", 80), ("a 141 GB H200", 141), ("a 192 GB B200", 192))


def gpu_memory_check(cfg: dict, weight_bytes: int | None) -> dict:
    """Weights per GPU under tensor parallelism, and the GPU memory that needs at vLLM's
    memory utilisation (weights only: the KV cache needs room on top)."""
    vcfg = cfg.get("vllm", {})
    if weight_bytes is None or vcfg.get("device") == "cpu":
        return {}
    tp = int(vcfg.get("tensor_parallel_size", 1) or 1)
    extra = list(vcfg.get("extra_args") or [])
    util = 0.9
    if "--gpu-memory-utilization" in extra[:-1]:
        util = float(extra[extra.index("--gpu-memory-utilization") + 1])
    hs = cfg.get("hidden_states", {})
    if hs.get("mode", "offline") != "offline" and shares_one_gpu(
        int(cfg.get("gpus", 1)), hs.get("server_gpus")
    ):
        # Online on one GPU the extraction server shares it with the trainer.
        util = float(hs.get("shared_gpu_server_memory", SHARED_GPU_SERVER_MEMORY))
    per_gpu = weight_bytes / tp
    need = per_gpu / util
    have = cfg.get("gpu_memory_gb")
    return {
        "tensor_parallel_size": tp,
        "memory_utilization": util,
        "weights_per_gpu_bytes": per_gpu,
        "min_gpu_bytes": need,
        "gpu_bytes": have * 1e9 if have else None,
        "fits": None if not have else have * 1e9 >= need,
    }


def _train_samples(cfg: dict, workdir: Path, basedir: Path, rebuilding: set[str]) -> tuple[int | None, str]:
    run = workdir / cfg["run_dir"]
    stats = _read_json(run / "prompts" / "prompts_stats.json")
    if stats and "prepare_prompts" not in rebuilding and isinstance(stats.get("train"), int):
        return stats["train"], "prompts_stats.json"
    total, unknown = 0, []
    for src in cfg.get("prompts", {}).get("sources", []):
        if src.get("samples"):
            total += int(src["samples"])
            continue
        n = None
        if src.get("type") == "bundled":
            n = _count_lines(basedir / "data" / "prompts" / src.get("path", "default.jsonl"))
        elif src.get("type") == "jsonl" and src.get("path"):
            p = Path(src["path"])
            n = _count_lines(p if p.is_absolute() else workdir / p)
        if n is None:
            unknown.append(src.get("name", "?"))
        else:
            total += n
    if unknown:
        return None, f"unknown: set 'samples' on source(s) {', '.join(unknown)}"
    held_out = int(cfg.get("prompts", {}).get("eval_samples", 0) or 0)
    return max(total - held_out, 0), "config sources minus eval_samples"


def _tokens_per_sample(cfg: dict) -> tuple[int | None, str]:
    """The tokens a sample is expected to hold, and where that figure comes from."""
    max_len = cfg.get("tokenize", {}).get("max_seq_len")
    per = cfg.get("hidden_states", {}).get("expected_tokens_per_sample")
    if per:
        return (
            min(int(per), int(max_len)) if max_len else int(per),
            "hidden_states.expected_tokens_per_sample",
        )
    if max_len:
        return int(max_len), "upper bound: tokenize.max_seq_len"
    return None, "unknown"


def _sample_and_token_counts(cfg: dict, workdir: Path, basedir: Path, rebuilding: set[str]) -> dict:
    """The estimate's samples and tokens, and their basis: measured by tokenize when its metadata
    is current, else estimated from the config."""
    meta = _read_json(workdir / cfg["run_dir"] / "tokenized" / "metadata.json")
    if meta and "tokenize" not in rebuilding and isinstance(meta.get("tokens_total"), int):
        return {
            "tokens": meta["tokens_total"],
            "samples": meta.get("samples_out"),
            "basis": "measured: tokenized/metadata.json",
        }
    samples, samples_from = _train_samples(cfg, workdir, basedir, rebuilding)
    per, per_from = _tokens_per_sample(cfg)
    counts = {
        "samples": samples,
        "tokens_per_sample": per,
        "basis": f"estimate: samples from {samples_from}; tokens/sample from {per_from}",
    }
    if samples is not None and per is not None:
        counts["tokens"] = samples * per
    return counts


def estimate_hidden_states(cfg: dict, workdir=".", rebuilding=(), basedir=None) -> dict:
    """Bytes the hidden-state shards will take, measured or estimated (see module doc).

    `rebuilding`: rules that will run (their outputs on disk are about to change); `basedir`:
    the Snakefile's folder (bundled prompts live under it)."""
    workdir = Path(workdir)
    basedir = Path(basedir) if basedir is not None else Path(__file__).resolve().parents[2]
    rebuilding = set(rebuilding)
    hs = cfg.get("hidden_states", {})
    dtype = hs.get("dtype", "bfloat16")
    dtype_bytes = DTYPE_BYTES.get(dtype)
    hidden, hidden_from = _hidden_size(cfg, workdir)
    run = workdir / cfg["run_dir"]
    est = {
        "dtype": dtype,
        "dtype_bytes": dtype_bytes,
        "hidden_size": hidden,
        "hidden_size_from": hidden_from,
        "num_shards": hs.get("num_shards"),
        "samples": None,
        "tokens_per_sample": None,
        "tokens": None,
        "bytes": None,
    }
    est.update(_sample_and_token_counts(cfg, workdir, basedir, rebuilding))
    if est["tokens"] is not None and hidden and dtype_bytes:
        est["bytes"] = hidden_state_bytes(est["tokens"], hidden, dtype)
    max_len = cfg.get("tokenize", {}).get("max_seq_len")
    sample = hidden_state_bytes(int(max_len), hidden, dtype) if max_len and hidden and dtype_bytes else None
    est["mode"] = hs.get("mode", "offline")
    est["peak_disk"] = peak_disk_by_mode(est["bytes"], sample, data_loaders(cfg))
    try:
        est["free_bytes"] = free_bytes(run)
    except OSError:
        est["free_bytes"] = None
    est["disk_margin_bytes"] = disk_margin_bytes(cfg)
    return est


__all__ = [
    "COMMON_GPUS",
    "DTYPE_BYTES",
    "GPU_ENGINE_FALLBACK",
    "HIDDEN_LAYERS_STORED",
    "MODES",
    "estimate_hidden_states",
    "gpu_memory_check",
    "hidden_state_bytes",
    "peak_disk_by_mode",
    "split_gpus",
    "target_status",
]
