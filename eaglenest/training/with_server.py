"""Training beside the run's extraction server (online and hybrid modes): the job's GPUs split
between the server and the trainer, the server's spec, and the trainer run while it serves.
Its own module: offline training starts no server.
"""

from __future__ import annotations

import logging

from eaglenest.engine.server import ServerSpec, serving
from eaglenest.hidden_states.extract import extraction_server_spec, spool_dir
from eaglenest.planning.run_estimate import job_gpus, split_gpus
from eaglenest.training.trainer import run_trainer, trainer_args

log = logging.getLogger(__name__)


def gpu_split(gpus: int, server_gpus: int | None) -> tuple[str, str]:
    """CUDA_VISIBLE_DEVICES of the server and of the trainer: the job's GPUs (as it was given
    them) split by eaglenest.planning.run_estimate.split_gpus; one GPU is shared."""

    devices = job_gpus(gpus)
    server, trainer = split_gpus(len(devices), server_gpus)
    if server + trainer > len(devices):  # one GPU, shared
        return devices[0], devices[0]
    return ",".join(devices[:server]), ",".join(devices[server:])


def online_server_spec(
    run_dir, target, plan, server_cfg, hs_dtype, gpus, server_gpus, shared_gpu_server_memory
) -> tuple[ServerSpec, str | None]:
    """The extraction server online training reads from, and the trainer's CUDA_VISIBLE_DEVICES
    (None: CPU, `gpus` None). On one GPU that both use, the server may take only
    `shared_gpu_server_memory` of it: vLLM's default 0.9 would leave the trainer almost nothing."""
    server_devices, trainer_devices = gpu_split(gpus, server_gpus) if gpus else (None, None)
    shared = server_devices is not None and server_devices == trainer_devices
    if shared:
        log.info(
            "the server and the trainer share GPU %s: the server may take %.0f%% of its memory "
            "(hidden_states.shared_gpu_server_memory)",
            server_devices,
            100 * shared_gpu_server_memory,
        )
    spec = extraction_server_spec(
        run_dir,
        target.path,
        plan,
        server_cfg,
        hs_dtype,
        server_devices,
        online=True,
        gpu_memory_utilization=shared_gpu_server_memory if shared else None,
    )
    return spec, trainer_devices


def train_with_server(
    run_dir, target, plan, server_cfg, hs_dtype, kept, gpus, server_gpus, shared_gpu_server_memory, train_args,
    log_file, metrics_file, ckpt_bytes,
) -> None:  # fmt: skip
    """Train while the run's extraction server (the spec extract_hidden_states uses, on its
    share of the GPUs; `gpus` None: CPU, shared) extracts each sample the trainer asks for.
    Online, every generated file is deleted once loaded; hybrid keeps it in `kept`."""
    # Lazy: it imports speculators' dataset module, which only online and hybrid runs use.
    from eaglenest.hidden_states.online import KEEP_ENV, KEY_ENV

    spec, trainer_devices = online_server_spec(
        run_dir, target, plan, server_cfg, hs_dtype, gpus, server_gpus, shared_gpu_server_memory
    )
    ranks = len(trainer_devices.split(",")) if trainer_devices else 1
    try:
        with serving(
            spec, run_dir, reuse=server_cfg["reuse"], timeout_s=server_cfg["startup_timeout_s"]
        ) as server:
            log.info("extracting hidden states on demand from the server on port %d", server.port)
            env = {KEY_ENV: server.api_key, KEEP_ENV: hs_dtype if kept is not None else ""}
            if trainer_devices:
                env["CUDA_VISIBLE_DEVICES"] = trainer_devices
            args = trainer_args(**train_args, vllm_endpoint=server.api_url)
            save_path = train_args["save_path"]
            run_trainer(args, ranks, log_file, metrics_file, save_path, ckpt_bytes, env=env)
    finally:
        # Files of requests the trainer never loaded (an interrupt): nothing outlives training.
        spool = spool_dir(run_dir)
        left = [f for f in spool.rglob("*") if f.is_file()] if spool.exists() else []
        for f in left:
            f.unlink()
        if left:
            log.info("removed %d unclaimed files from the extraction spool %s", len(left), spool)
