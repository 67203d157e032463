"""speculators' trainer as a child process: its command line (the flags of one run, torchrun
for several GPUs) and running it, recording per-epoch metrics. Its own module: the flags are
what the provenance record, the benchmarks and the tests check, apart from the stage.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from eaglenest.core.io import disk_full, free_bytes, reports_disk_full
from eaglenest.draft.algorithms import trainer_flags
from eaglenest.engine.server import log_tail
from eaglenest.training.checkpoints import remove_incomplete_checkpoints
from eaglenest.training.metrics import METRICS_FILE_ENV

log = logging.getLogger(__name__)


def _input_flags(
    target,
    data_dir,
    save_path,
    draft_config,
    d2t_npy,
    t2d_npy,
    draft_vocab_size: int,
    aux_layer_ids: list[int],
) -> list[str]:
    """The flags naming the run's files and folders, its draft vocabulary and the aux layers."""
    return [
        "--verifier-name-or-path",
        str(Path(target).resolve()),
        "--data-path",
        str(data_dir),
        "--save-path",
        str(save_path),
        "--draft-config",
        str(draft_config),
        "--d2t-path",
        str(d2t_npy),
        "--t2d-path",
        str(t2d_npy),
        "--draft-vocab-size",
        str(draft_vocab_size),
        "--target-layer-ids",
        *map(str, aux_layer_ids),
    ]


def _hyperparameter_flags(hp: dict) -> list[str]:
    """The flags of the config's `train` hyperparameters that every run passes."""
    return [
        "--epochs",
        str(hp["epochs"]),
        "--lr",
        str(hp["lr"]),
        "--optimizer",
        hp["optimizer"],
        "--ttt-steps",
        str(hp["ttt_steps"]),
        "--total-seq-len",
        str(hp["total_seq_len"]),
        "--hidden-states-dtype",
        hp["dtype"],
        "--train-data-ratio",
        str(hp["train_data_ratio"]),
        "--num-workers",
        str(hp["num_workers"]),
        "--seed",
        str(hp["seed"]),
    ]


def trainer_args(
    *,
    target: str,
    data_dir,
    save_path,
    draft_config,
    d2t_npy,
    t2d_npy,
    draft_vocab_size: int,
    aux_layer_ids: list[int],
    hp: dict,
    cpu: bool,
    log_dir,
    trust_remote_code: bool = False,
    vllm_endpoint: str | None = None,
    fp8: bool = False,
    algorithm: str = "eagle3",
    mask_token_id: int | None = None,
) -> list[str]:
    """speculators' `train` flags for one run (hp: the config's `train` section, with the
    algorithm's own settings under its name: training.sweep.train_settings; `target`: the
    resolved target folder, a hub snapshot for a hub id; `algorithm` and `mask_token_id`: the
    draft config's). With `vllm_endpoint`, samples without a stored file are extracted from
    that server (online, hybrid); without, a missing one is an error. `fp8`: the stored and
    served files are hs_connectors' fp8."""
    args = [
        *trainer_flags(algorithm, hp.get(algorithm, {}), mask_token_id),
        *_input_flags(
            target, data_dir, save_path, draft_config, d2t_npy, t2d_npy, draft_vocab_size, aux_layer_ids
        ),
        *_hyperparameter_flags(hp),
        *(
            ["--on-missing", "generate", "--vllm-endpoint", vllm_endpoint]
            if vllm_endpoint
            else ["--on-missing", "raise"]
        ),
        *(["--hidden-states-backend", "fp8"] if fp8 else []),
        "--log-dir",
        str(log_dir),
        "--scheduler-type",
        hp.get("scheduler", "none"),
    ]
    if trust_remote_code:
        args.append("--trust-remote-code")
    if hp.get("norm_before_residual") is False:
        # The form SGLang's forward computes (a run that exports to it: training.sweep.train_settings).
        args.append("--no-norm-before-residual")
    if cpu:
        # The fused loss is a Triton kernel and FlexAttention has no CPU backward.
        args += ["--loss-implementation", "eager", "--draft-attn-impl", "sdpa"]
    return args


def trainer_command(args: list[str], gpus: int) -> list[str]:
    """The trainer's command line: torchrun with one rank per GPU when there are several."""
    if gpus > 1:
        # --standalone: a rendezvous on a free local port, so two runs on one node (or a port
        # left in TIME_WAIT) never collide on torchrun's default 29500.
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={gpus}",
            "-m",
            "eaglenest.training.train",
            *args,
        ]
    return [sys.executable, "-m", "eaglenest.training.train", *args]


def run_trainer(
    args: list[str],
    gpus: int,
    log_file,
    metrics_file,
    save_path,
    checkpoint_bytes: int,
    env: dict | None = None,
) -> None:
    """Run speculators' trainer in a child process, recording per-epoch metrics to
    `metrics_file` (`env`: more variables for it). A failure for want of disk for a checkpoint
    says so."""

    cmd = trainer_command(args, gpus)
    log.info("$ %s", " ".join(cmd))
    with open(log_file, "ab") as f:
        proc = subprocess.run(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {}), METRICS_FILE_ENV: str(metrics_file)},
        )
    if proc.returncode != 0:
        tail = log_tail(log_file)
        if reports_disk_full(tail) or free_bytes(save_path) < checkpoint_bytes:
            remove_incomplete_checkpoints(save_path)
            raise disk_full(save_path, checkpoint_bytes, "a training checkpoint")
        raise RuntimeError(
            f"speculators train failed (exit {proc.returncode}). Last lines of {log_file}:\n{tail}"
        )
