"""Train the EAGLE-3 draft with speculators' own trainer.

eaglenest only assembles the trainer's inputs (data folder, vocabulary mapping, draft config)
and its command line; the training loop, checkpoints and resume are speculators'. Checkpoints
live in a folder keyed by the training spec outside Snakemake's outputs, so a rerun after an
interrupt resumes from the last epoch instead of step 0.

On a CPU-only machine, `python -m eaglenest.train` applies three small patches first (see
`patch_for_cpu`): speculators 0.9.0 assumes an accelerator in three places. Remove them once
speculators runs on CPU by itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)


def patch_for_cpu() -> None:
    """Let speculators 0.9.0's trainer run without an accelerator.

    1. `Trainer` moves the model and batches to `get_local_rank()` (an accelerator index):
       make that `"cpu"`.
    2. Its step timer calls `torch.accelerator.synchronize()`: a no-op without one.
    3. Autocast falls back to device type "cuda" when no accelerator exists: use "cpu".
    """
    import torch
    import speculators.train.trainer as trainer_mod

    if torch.accelerator.current_accelerator() is not None:
        return
    trainer_mod.get_local_rank = lambda: "cpu"
    torch.accelerator.synchronize = lambda *a, **k: None
    original_init = trainer_mod.Trainer.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.device_type = "cpu"

    trainer_mod.Trainer.__init__ = init


def spec_key(args: list[str]) -> str:
    return hashlib.sha256(json.dumps(args).encode()).hexdigest()[:12]


def trainer_args(*, target: str, data_dir, save_path, draft_config, d2t_npy, t2d_npy,
                 draft_vocab_size: int, aux_layer_ids: list[int], hp: dict, cpu: bool,
                 log_dir) -> list[str]:
    """speculators' `train` flags for one EAGLE-3 run (hp: the config's `train` section)."""
    args = [
        "--speculator-type", "eagle3",
        "--verifier-name-or-path", str(Path(target).resolve()),
        "--data-path", str(data_dir),
        "--save-path", str(save_path),
        "--draft-config", str(draft_config),
        "--d2t-path", str(d2t_npy), "--t2d-path", str(t2d_npy),
        "--draft-vocab-size", str(draft_vocab_size),
        "--target-layer-ids", *map(str, aux_layer_ids),
        "--epochs", str(hp["epochs"]),
        "--lr", str(hp["lr"]),
        "--optimizer", hp["optimizer"],
        "--ttt-steps", str(hp["ttt_steps"]),
        "--total-seq-len", str(hp["total_seq_len"]),
        "--hidden-states-dtype", hp["dtype"],
        "--train-data-ratio", str(hp["train_data_ratio"]),
        "--num-workers", str(hp["num_workers"]),
        "--seed", str(hp["seed"]),
        "--on-missing", "raise",
        "--log-dir", str(log_dir),
        "--scheduler-type", hp.get("scheduler", "none"),
    ]
    if cpu:
        # The fused loss is a Triton kernel and FlexAttention has no CPU backward.
        args += ["--loss-implementation", "eager", "--draft-attn-impl", "sdpa"]
    return args


def run_trainer(args: list[str], gpus: int, log_file) -> None:
    """Run speculators' trainer in a child process (torchrun when several GPUs)."""
    if gpus > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={gpus}",
               "-m", "eaglenest.train", *args]
    else:
        cmd = [sys.executable, "-m", "eaglenest.train", *args]
    log.info("$ %s", " ".join(cmd))
    with open(log_file, "ab") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=os.environ.copy())
    if proc.returncode != 0:
        from eaglenest.server import log_tail

        raise RuntimeError(f"speculators train failed (exit {proc.returncode}). Last lines of "
                           f"{log_file}:\n{log_tail(log_file)}")


def epochs_done(save_path) -> list[int]:
    save_path = Path(save_path)
    if not save_path.exists():
        return []
    return sorted(int(p.name) for p in save_path.iterdir() if p.is_dir() and p.name.isdigit())


def main(argv: list[str]) -> None:
    patch_for_cpu()
    from speculators.train.cli import main as train_main
    from speculators.train.config import TrainConfig

    train_main(TrainConfig.resolve(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
