"""Train the EAGLE-3 draft with speculators' own trainer: the `train_draft` stage
(`train_stage`) and the trainer's entry point (`python -m eaglenest.training.train`).

eaglenest only assembles the trainer's inputs (data folder, vocabulary mapping, draft config)
and its command line; the training loop, checkpoints and resume are speculators'. Checkpoints
live in a folder keyed by the training spec outside Snakemake's outputs, so a rerun after an
interrupt resumes from the last epoch instead of step 0. The parts live beside this module:
the trainer's command line and its run (training.trainer), the data folder it reads
(training.data_folder), its checkpoints and the spec's folder (training.checkpoints), the
per-epoch metrics and curves (training.metrics), and online and hybrid training beside the
run's extraction server (training.with_server).

On a CPU-only machine, `python -m eaglenest.training.train` applies four small patches first
(see eaglenest.training.speculators_internals.patch_for_cpu, where every patch of speculators
lives): speculators 0.9.0 assumes an accelerator in four places. Remove them once speculators
runs on CPU by itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from pathlib import Path

from eaglenest.core.io import read_json, write_json
from eaglenest.draft.algorithms import draft_algorithm
from eaglenest.engine.server import Lease
from eaglenest.hidden_states.extract import FP8
from eaglenest.hidden_states.shard_check import verify_shards
from eaglenest.hidden_states.store import forget as forget_stored_samples
from eaglenest.hidden_states.store import prune as prune_sample_store
from eaglenest.pipeline.workflow import resolve_device
from eaglenest.planning.run_estimate import SHARED_GPU_SERVER_MEMORY, job_gpus
from eaglenest.training.checkpoints import (
    checkpoint_bytes,
    epochs_done,
    keep_last_checkpoint,
    prune_after_training,
    remove_incomplete_checkpoints,
    training_folder,
)
from eaglenest.training.contracts import check_training_inputs
from eaglenest.training.data_folder import data_fraction_rows, kept_hidden_states, link_training_data
from eaglenest.training.metrics import METRICS_FILE_ENV, collect_metrics, plot_curves, record_epoch_metrics
from eaglenest.training.provenance import run_provenance
from eaglenest.training.speculators_internals import (
    check_internals,
    patch_for_cpu,
    patch_fused_loss_configs,
    use_served_dataset,
)
from eaglenest.training.trainer import run_trainer, trainer_args
from eaglenest.training.with_server import train_with_server

log = logging.getLogger(__name__)


def spec_key(args: list[str]) -> str:
    return hashlib.sha256(json.dumps(args).encode()).hexdigest()[:12]


def _file_digest(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def _verify_inputs(
    run_dir, shard_dirs, plan_path, draft_config_path, t2d_npy, d2t_npy, offline: bool
) -> None:
    """Check the hidden states and the inputs agree; offline, free the leased server's accelerators."""
    if offline:
        # A file truncated or corrupted after its shard finished must fail here, naming the
        # file and the shard, not hours into training inside speculators' data loader.
        log.info("hidden-state files intact: %s", verify_shards(shard_dirs, forget=forget_stored_samples))
    # Every shard is whole (online and hybrid: none is made): a stored sample none of them holds
    # is of rows, or settings, the run no longer has.
    log.info("sample store, samples no shard holds removed: %s", prune_sample_store(run_dir))
    hs_sources = shard_dirs if offline else [plan_path]
    log.info(
        "training inputs agree: %s", check_training_inputs(draft_config_path, hs_sources, t2d_npy, d2t_npy)
    )
    if offline:
        Lease(run_dir).release()  # training needs the accelerators the leased server holds


def _hidden_states_key(shard_dirs, plan_path, hs_dtype, tokenized_path, target_record, offline: bool) -> list:
    """The hidden states' part of the training spec (also the key of hybrid's kept samples)."""
    if offline:
        return [read_json(Path(s) / "manifest.json") for s in shard_dirs]
    return [read_json(plan_path), hs_dtype, _file_digest(tokenized_path), _file_digest(target_record)]


def _spec_folder(
    run_dir, out_checkpoint, hp, dcfg, t2d_npy, d2t_npy, tokenized_path, hs_mode, hs_key
) -> Path:
    """The training spec's folder, keyed by everything the trained draft depends on."""
    inputs = (hp, dcfg, *map(_file_digest, (t2d_npy, d2t_npy, tokenized_path)), hs_mode, hs_key)
    return training_folder(run_dir, spec_key(list(inputs)), out_checkpoint)


def _row_split(tokenized_path, hp: dict, prompts_path=None) -> tuple[list[int] | None, dict, dict]:
    """The rows trained on (None: all), the hyperparameters for them, and the summary's split figures."""
    subset, hp, num_rows = data_fraction_rows(tokenized_path, hp, prompts_path)
    fraction = hp.get("data_fraction", 1.0)
    train_rows = int(num_rows * hp["train_data_ratio"])
    log.info(
        "training on %d rows, validating on %d (data fraction %g, sources %s)",
        train_rows,
        num_rows - train_rows,
        fraction,
        ", ".join(hp.get("sources") or ["all"]),
    )
    split = {"data_fraction": fraction, "train_rows": train_rows, "val_rows": num_rows - train_rows}
    return subset, hp, split


def _epochs_already_done(save_path, work: Path, hs_mode: str, hp: dict) -> list[int]:
    """The epochs an earlier run of this spec finished, after removing any checkpoint cut short."""
    remove_incomplete_checkpoints(save_path)
    done = epochs_done(save_path)
    log.info(
        "training spec %s (%s hidden states): %d of %d epochs already done%s",
        work.name,
        hs_mode,
        len(done),
        hp["epochs"],
        " (resuming)" if done else "",
    )
    return done


def _claim_cuda(device: str, gpus: int) -> bool:
    """Whether training runs on CUDA; there, the job's GPUs are claimed first."""
    cuda = resolve_device(device) == "cuda"
    if cuda:
        job_gpus(gpus)  # as many GPUs as ranks, before anything starts
    return cuda


def _train_args(
    target, data_dir, save_path, log_dir, draft_config_path, t2d_npy, d2t_npy, dcfg, hp, cuda, hs_dtype
) -> dict:
    """trainer_args' keyword arguments for this run."""
    return dict(
        target=target.path,
        data_dir=data_dir,
        save_path=save_path,
        draft_config=draft_config_path,
        d2t_npy=Path(d2t_npy).resolve(),
        t2d_npy=Path(t2d_npy).resolve(),
        draft_vocab_size=dcfg["eaglenest"]["draft_vocab_size"],
        aux_layer_ids=dcfg["eaglenest"]["aux_layer_ids"],
        hp=hp,
        cpu=not cuda,
        log_dir=log_dir,
        trust_remote_code=target.trust_remote_code,
        fp8=hs_dtype == FP8,
        algorithm=draft_algorithm(dcfg),
        mask_token_id=dcfg["eaglenest"].get("mask_token", {}).get("id"),
    )


def _run_training(
    offline, run_dir, target, plan_path, server_cfg, hs_dtype, kept, gpus, cuda, server_gpus,
    shared_gpu_server_memory, train_args, log_file, metrics_file, save_path, dcfg,
) -> None:  # fmt: skip
    """Run the trainer: on the shards offline, beside the run's extraction server online and hybrid."""
    ckpt_bytes = checkpoint_bytes(save_path, dcfg)
    if offline:
        run_trainer(
            trainer_args(**train_args), gpus if cuda else 1, log_file, metrics_file, save_path, ckpt_bytes
        )
    else:
        train_with_server(
            run_dir, target, read_json(plan_path), server_cfg, hs_dtype, kept, gpus if cuda else None,
            server_gpus, shared_gpu_server_memory, train_args, log_file, metrics_file, ckpt_bytes,
        )  # fmt: skip


def _training_summary(final, done, hs_mode, split, metrics, train_args, offline: bool, kept) -> dict:
    """The stage's metrics record: epochs, resume point, rows, per-epoch metrics and provenance."""
    summary = {
        "epochs": final[-1] + 1,  # epochs count from 0; earlier ones' checkpoints are pruned
        "resumed_from_epoch": done[-1] if done else None,
        "final_epoch": final[-1],
        "hidden_states_mode": hs_mode,
        **split,
        "per_epoch": metrics,
        # Online and hybrid runs pass the server's URL, whose port differs per run: a stand-in
        # records that the trainer extracts on demand without tying the record to a port.
        "provenance": run_provenance(
            trainer_args(**train_args, vllm_endpoint=None if offline else "<the run's extraction server>")
        ),
    }
    if kept is not None:
        summary["hidden_states_kept"] = len(list(kept.glob("hs_*.safetensors")))
    return summary


def train_stage(
    *,
    run_dir,
    target,
    shard_dirs,
    tokenized_path,
    t2d_npy,
    d2t_npy,
    draft_config_path,
    hp: dict,
    gpus: int,
    device: str,
    hs_mode: str = "offline",
    hs_dtype: str = "bfloat16",
    server_cfg: dict | None = None,
    server_gpus: int | None = None,
    shared_gpu_server_memory: float = SHARED_GPU_SERVER_MEMORY,
    plan_path=None,
    target_record=None,
    prompts_path=None,
    out_checkpoint,
    out_metrics,
    out_curves,
    log_file,
) -> dict:
    """The `train_draft` rule: assemble the trainer's inputs, train (resuming), keep the result.
    `target` is the resolved target (eaglenest.target.resolve.Target). Offline, the trainer reads the
    shards; online and hybrid (`hs_mode`), it extracts from the run's server as it trains,
    which needs the hidden-state plan (`plan_path`), the target's record (`target_record`) and
    the server's params (`server_cfg`). A sweep's `sources` variant (`hp["sources"]`) reads
    each row's source from the training prompts (`prompts_path`)."""

    check_internals()  # before any input is checked or linked: a speculators that moved fails first
    offline = hs_mode == "offline"
    _verify_inputs(run_dir, shard_dirs, plan_path, draft_config_path, t2d_npy, d2t_npy, offline)
    dcfg = read_json(draft_config_path)
    # What the hidden states are: the shards' records, or what training will extract.
    hs_key = _hidden_states_key(shard_dirs, plan_path, hs_dtype, tokenized_path, target_record, offline)
    work = _spec_folder(run_dir, out_checkpoint, hp, dcfg, t2d_npy, d2t_npy, tokenized_path, hs_mode, hs_key)
    data_dir, save_path, log_dir = work / "data", work / "checkpoints", work / "logs"
    kept = kept_hidden_states(run_dir, spec_key(hs_key)) if hs_mode == "hybrid" else None
    subset, hp, split = _row_split(tokenized_path, hp, prompts_path)
    link_training_data(tokenized_path, shard_dirs if offline else [], data_dir, kept=kept, rows=subset)
    done = _epochs_already_done(save_path, work, hs_mode, hp)
    cuda = _claim_cuda(device, gpus)
    train_args = _train_args(
        target, data_dir, save_path, log_dir, draft_config_path, t2d_npy, d2t_npy, dcfg, hp, cuda, hs_dtype
    )
    metrics_file = work / "epoch_metrics.jsonl"
    _run_training(
        offline, run_dir, target, plan_path, server_cfg, hs_dtype, kept, gpus, cuda, server_gpus,
        shared_gpu_server_memory, train_args, log_file, metrics_file, save_path, dcfg,
    )  # fmt: skip
    final = keep_last_checkpoint(save_path, out_checkpoint)
    metrics = collect_metrics(metrics_file)
    summary = _training_summary(final, done, hs_mode, split, metrics, train_args, offline, kept)
    write_json(out_metrics, summary)
    plot_curves(metrics, out_curves, draft_algorithm(dcfg))
    prune_after_training(work, save_path, out_checkpoint)
    return summary


def main(argv: list[str]) -> None:

    check_internals()
    patch_for_cpu()
    patch_fused_loss_configs()
    # Unset when the command in a checkpoint's train_command.txt is replayed by hand.
    if os.environ.get(METRICS_FILE_ENV):
        record_epoch_metrics(os.environ[METRICS_FILE_ENV])
    # Lazy: it imports speculators' dataset module, which only online and hybrid runs use.
    from eaglenest.hidden_states import online as online_data

    if os.environ.get(online_data.KEY_ENV):  # online and hybrid mode
        use_served_dataset()
    from speculators.train.cli import main as train_main
    from speculators.train.config import TrainConfig

    train_main(TrainConfig.resolve(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
