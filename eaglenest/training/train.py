"""Train the EAGLE-3 draft with speculators' own trainer.

eaglenest only assembles the trainer's inputs (data folder, vocabulary mapping, draft config)
and its command line; the training loop, checkpoints and resume are speculators'. Checkpoints
live in a folder keyed by the training spec outside Snakemake's outputs, so a rerun after an
interrupt resumes from the last epoch instead of step 0.

On a CPU-only machine, `python -m eaglenest.training.train` applies four small patches first
(see eaglenest.training.speculators_internals.patch_for_cpu, where every patch of speculators
lives): speculators 0.9.0 assumes an accelerator in four places. Remove them once speculators
runs on CPU by itself.

Per-epoch metrics come from speculators' metric log, recorded to a file by `EpochMetricsFile`:
speculators writes `val_metrics.json` only into checkpoints that improved the validation loss,
so curves read from checkpoints would silently skip the epochs that did not.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import (
    atomic_path,
    disk_full,
    free_bytes,
    human_bytes,
    iter_jsonl,
    read_json,
    reports_disk_full,
    write_json,
)
from eaglenest.draft.algorithms import draft_algorithm, position_accuracies, trainer_flags
from eaglenest.draft.config import draft_parameter_count
from eaglenest.engine.server import Lease, ServerSpec, log_tail, serving
from eaglenest.hidden_states.extract import FP8, extraction_server_spec, spool_dir
from eaglenest.hidden_states.shard_check import header_problem, verify_shards
from eaglenest.pipeline.workflow import resolve_device
from eaglenest.planning.run_estimate import SHARED_GPU_SERVER_MEMORY, job_gpus, split_gpus
from eaglenest.training.contracts import check_training_inputs
from eaglenest.training.provenance import run_provenance
from eaglenest.training.speculators_internals import (
    call_after_metric_logger_setup,
    check_internals,
    patch_for_cpu,
    patch_fused_loss_configs,
    use_served_dataset,
)
from eaglenest.training.sweep import training_subset

log = logging.getLogger(__name__)


#: Where the trainer child process records per-epoch metrics (set by `run_trainer`).
METRICS_FILE_ENV = "EAGLENEST_EPOCH_METRICS"


class EpochMetricsFile(logging.Handler):
    """Append one JSON line per epoch to `path`: the mean of speculators' per-step training
    metrics over the epoch, its number of steps, and the epoch's validation metrics. A line is
    written when the validation record arrives. speculators saves an epoch's checkpoint before
    validating it, so an interrupt during validation leaves that epoch without a line (the rerun
    resumes after it); one during training leaves none either, and the rerun records the epoch."""

    def __init__(self, path) -> None:
        super().__init__()
        self.path = Path(path)
        self.epoch = None
        self.train_sums: dict[str, float] = {}
        self.train_steps = 0

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.msg
        if not isinstance(msg, Mapping):
            return
        epoch = msg.get("epoch")
        if epoch != self.epoch:
            self.epoch, self.train_sums, self.train_steps = epoch, {}, 0
        if isinstance(msg.get("train"), Mapping):
            for k, v in msg["train"].items():
                if isinstance(v, (int, float)):
                    self.train_sums[k] = self.train_sums.get(k, 0.0) + v
            self.train_steps += 1
        elif isinstance(msg.get("val"), Mapping):
            train = {f"{k}_epoch": v / self.train_steps for k, v in self.train_sums.items()}
            # The optimizer steps of the epoch: what a comparison at equal budget matches.
            row = {"epoch": epoch, "train_steps": self.train_steps, "train": train, "val": dict(msg["val"])}
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")


def record_epoch_metrics(path) -> None:
    """Attach `EpochMetricsFile` to speculators' metric logger once the trainer has set that
    logger up (its set-up replaces the logger's handlers). Rank 0 only."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    call_after_metric_logger_setup(
        lambda: logging.getLogger("speculators.metrics").addHandler(EpochMetricsFile(path))
    )


def spec_key(args: list[str]) -> str:
    return hashlib.sha256(json.dumps(args).encode()).hexdigest()[:12]


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


def checkpoint_problem(folder: Path) -> str | None:
    """What is missing or cut short in one of speculators' epoch checkpoints (it writes them in
    place: a kill or a full disk can leave one half-written), or None."""

    model, optimizer = folder / "model.safetensors", folder / "optimizer_state_dict.pt"
    for f in (model, folder / "config.json", optimizer):
        if not f.exists():
            return f"no {f.name}"
    problem = header_problem(model, required=())
    if problem:
        return f"{model.name}: {problem}"
    try:
        json.loads((folder / "config.json").read_text())
        with zipfile.ZipFile(optimizer):  # torch.save writes a zip: a cut one has no directory
            pass
    except (ValueError, zipfile.BadZipFile) as e:
        return f"unreadable: {e}"
    return None


def remove_incomplete_checkpoints(save_path) -> None:
    """Delete half-written epoch checkpoints, so that speculators resumes from the last whole one."""
    save_path = Path(save_path)
    for folder in save_path.iterdir() if save_path.exists() else ():
        if folder.is_dir() and not folder.is_symlink() and folder.name.isdigit():
            problem = checkpoint_problem(folder)
            if problem:
                log.warning("removing the incomplete checkpoint %s (%s)", folder, problem)
                shutil.rmtree(folder)


def epochs_done(save_path) -> list[int]:
    """The epochs with a whole checkpoint."""
    save_path = Path(save_path)
    if not save_path.exists():
        return []
    return sorted(
        int(p.name)
        for p in save_path.iterdir()
        if p.is_dir() and not p.is_symlink() and p.name.isdigit() and checkpoint_problem(p) is None
    )


def checkpoint_bytes(save_path, draft_config: dict) -> int:
    """What one more checkpoint takes: the last one's size, else the draft's bf16 weights and
    about as much optimizer state."""
    done = epochs_done(save_path)
    if done:
        return sum(f.stat().st_size for f in (Path(save_path) / str(done[-1])).iterdir() if f.is_file())

    return 2 * 2 * draft_parameter_count(draft_config)


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


def _file_digest(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def collect_metrics(metrics_file) -> list[dict]:
    """Per-epoch training means and validation metrics, one row per epoch in order. An epoch
    rerun after an interrupt was recorded twice: its last record wins."""

    if not Path(metrics_file).exists():
        return []
    by_epoch = {row["epoch"]: row for row in iter_jsonl(metrics_file)}
    return [by_epoch[e] for e in sorted(by_epoch)]


def plot_curves(metrics: list[dict], out_png, algorithm: str = "eagle3") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    epochs = [m["epoch"] for m in metrics]
    for split, style in (("train", "--"), ("val", "-")):
        ax_loss.plot(epochs, [m[split].get("loss_epoch") for m in metrics], style, marker="o", label=split)
    ax_loss.set(xlabel="epoch", ylabel="loss", title="Loss")
    ax_loss.legend()
    val = [position_accuracies(m["val"], algorithm) for m in metrics]
    train = [position_accuracies(m["train"], algorithm) for m in metrics]
    for p in sorted({p for v in val for p in v}):
        (line,) = ax_acc.plot(
            epochs,
            [v.get(p) for v in val],
            marker="o",
            label=f"position {p} (val)",
        )
        ax_acc.plot(
            epochs,
            [t.get(p) for t in train],
            "--",
            color=line.get_color(),
            label=f"position {p} (train)",
        )
    ax_acc.set(xlabel="epoch", ylabel="accuracy", title="Per-position accuracy", ylim=(0, 1))
    ax_acc.legend(fontsize="small")
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


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
    out_checkpoint,
    out_metrics,
    out_curves,
    log_file,
) -> dict:
    """The `train_draft` rule: assemble the trainer's inputs, train (resuming), keep the result.
    `target` is the resolved target (eaglenest.target.resolve.Target). Offline, the trainer reads the
    shards; online and hybrid (`hs_mode`), it extracts from the run's server as it trains,
    which needs the hidden-state plan (`plan_path`), the target's record (`target_record`) and
    the server's params (`server_cfg`)."""

    check_internals()  # before any input is checked or linked: a speculators that moved fails first
    offline = hs_mode == "offline"
    if offline:
        # A file truncated or corrupted after its shard finished must fail here, naming the
        # file and the shard, not hours into training inside speculators' data loader.
        log.info("hidden-state files intact: %s", verify_shards(shard_dirs))
    hs_sources = shard_dirs if offline else [plan_path]
    log.info(
        "training inputs agree: %s", check_training_inputs(draft_config_path, hs_sources, t2d_npy, d2t_npy)
    )
    if offline:
        Lease(run_dir).release()  # training needs the accelerators the leased server holds
    dcfg = read_json(draft_config_path)
    # What the hidden states are: the shards' records, or what training will extract.
    hs_key = (
        [read_json(Path(s) / "manifest.json") for s in shard_dirs]
        if offline
        else [read_json(plan_path), hs_dtype, _file_digest(tokenized_path), _file_digest(target_record)]
    )
    inputs = (hp, dcfg, *map(_file_digest, (t2d_npy, d2t_npy, tokenized_path)), hs_mode, hs_key)
    work = training_folder(run_dir, spec_key(list(inputs)), out_checkpoint)
    data_dir, save_path = work / "data", work / "checkpoints"
    kept = kept_hidden_states(run_dir, spec_key(hs_key)) if hs_mode == "hybrid" else None
    subset, hp, num_rows = data_fraction_rows(tokenized_path, hp)
    fraction = hp.get("data_fraction", 1.0)
    train_rows = int(num_rows * hp["train_data_ratio"])
    log.info(
        "training on %d rows, validating on %d (data fraction %g)",
        train_rows,
        num_rows - train_rows,
        fraction,
    )
    link_training_data(tokenized_path, shard_dirs if offline else [], data_dir, kept=kept, rows=subset)
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
    cuda = resolve_device(device) == "cuda"
    if cuda:
        job_gpus(gpus)  # as many GPUs as ranks, before anything starts
    train_args = dict(
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
        log_dir=work / "logs",
        trust_remote_code=target.trust_remote_code,
        fp8=hs_dtype == FP8,
        algorithm=draft_algorithm(dcfg),
        mask_token_id=dcfg["eaglenest"].get("mask_token", {}).get("id"),
    )
    metrics_file = work / "epoch_metrics.jsonl"
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
    final = keep_last_checkpoint(save_path, out_checkpoint)
    metrics = collect_metrics(metrics_file)
    summary = {
        "epochs": final[-1] + 1,  # epochs count from 0; earlier ones' checkpoints are pruned
        "resumed_from_epoch": done[-1] if done else None,
        "final_epoch": final[-1],
        "hidden_states_mode": hs_mode,
        "data_fraction": fraction,
        "train_rows": train_rows,
        "val_rows": num_rows - train_rows,
        "per_epoch": metrics,
        # Online and hybrid runs pass the server's URL, whose port differs per run: a stand-in
        # records that the trainer extracts on demand without tying the record to a port.
        "provenance": run_provenance(
            trainer_args(**train_args, vllm_endpoint=None if offline else "<the run's extraction server>")
        ),
    }
    if kept is not None:
        summary["hidden_states_kept"] = len(list(kept.glob("hs_*.safetensors")))
    write_json(out_metrics, summary)
    plot_curves(metrics, out_curves, draft_algorithm(dcfg))
    prune_after_training(work, save_path, out_checkpoint)
    return summary


# Names the output a training folder trains for, so a later spec for it can prune this one.
OWNER_FILE = "owner.json"


def training_folder(run_dir, key: str, out_checkpoint) -> Path:
    """The training spec's own folder (`.eaglenest/train/<key>`), named for the output it trains
    (OWNER_FILE), so a later spec for the same output can prune it."""
    work = Path(run_dir).resolve() / ".eaglenest" / "train" / key
    work.mkdir(parents=True, exist_ok=True)
    write_json(work / OWNER_FILE, {"output": str(Path(out_checkpoint).resolve()), "spec": key})
    return work


def data_fraction_rows(tokenized_path, hp: dict) -> tuple[list[int] | None, dict, int]:
    """A sweep's `data_fraction`: the rows trained and validated on (None: all), the
    hyperparameters with the train ratio that keeps the validation rows whole, the row count."""
    num_rows = sum(1 for _ in iter_jsonl(tokenized_path))
    fraction = hp.get("data_fraction", 1.0)
    if fraction >= 1:
        return None, hp, num_rows
    subset, ratio = training_subset(num_rows, hp["train_data_ratio"], fraction, hp["seed"], tokenized_path)
    return subset, {**hp, "train_data_ratio": ratio}, len(subset)


def keep_last_checkpoint(save_path: Path, out_checkpoint) -> list[int]:
    """Copy the last epoch's draft (config and weights, no optimizer) to the rule's output;
    return the epochs done."""
    final = epochs_done(save_path)
    if not final:
        raise RuntimeError(f"speculators wrote no checkpoint into {save_path}")
    with atomic_path(out_checkpoint, is_dir=True) as tmp:
        for name in ("config.json", "model.safetensors"):
            shutil.copy(save_path / str(final[-1]) / name, tmp / name)
    return final


def prune_after_training(work: Path, save_path: Path, out_checkpoint) -> int:
    """Once a spec's training is whole and kept in its output: the folders of earlier specs
    for the same output (a changed hyperparameter, a sweep variant's new settings), which no
    variant of the config trains any more, and this spec's checkpoints before its last epoch
    (each holds the optimizer state; speculators 0.9.0 also saves the frozen target embedding
    in every one: about 2.35 GB at Kimi's shape). Returns the bytes freed."""

    owner = str(Path(out_checkpoint).resolve())
    stale = [
        other
        for other in work.parent.iterdir()
        if other != work
        and (other / OWNER_FILE).is_file()
        and read_json(other / OWNER_FILE).get("output") == owner
    ]
    last = epochs_done(save_path)[-1]
    stale += [p for p in save_path.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) != last]
    freed = 0
    for folder in stale:
        freed += sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
        shutil.rmtree(folder)
    # speculators' links to its checkpoints (epoch<N>_end, checkpoint_best) that now point nowhere.
    for link in save_path.iterdir():
        if link.is_symlink() and not link.exists():
            link.unlink()
    if stale:
        log.info(
            "pruned %d superseded training folders and checkpoints: %s freed", len(stale), human_bytes(freed)
        )
    return freed


def link_training_data(tokenized_path, shard_dirs, data_dir, kept=None, rows=None) -> Path:
    """Assemble the folder speculators' trainer reads: a `save_to_disk` dataset of the rows and
    `hidden_states/hs_{i}.safetensors` linking into the shards (no copy of the big files).
    Without shards (online, hybrid) `hidden_states` is empty, or is hybrid's `kept` folder,
    where the trainer keeps what it extracts. `rows` (indices into the tokenized rows, a
    sweep's data subset) picks the rows, renumbered in that order, each linked to its own file."""
    from datasets import Dataset

    data_dir = Path(data_dir)
    if data_dir.exists():
        shutil.rmtree(data_dir)
    all_rows = list(iter_jsonl(tokenized_path))
    picked = list(range(len(all_rows))) if rows is None else list(rows)
    hs_dir = data_dir / "hidden_states"
    data_dir.mkdir(parents=True)
    if kept is not None:
        hs_dir.symlink_to(Path(kept).resolve(), target_is_directory=True)
    else:
        hs_dir.mkdir()
    files = {f.name: f for shard in shard_dirs for f in Path(shard).glob("hs_*.safetensors")}
    if shard_dirs and len(files) != len(all_rows):
        raise EaglenestError(
            f"shards hold {len(files)} samples but {tokenized_path} has {len(all_rows)} rows",
            shard_dirs[0] if shard_dirs else None,
        )
    for i, row in enumerate(picked if shard_dirs else ()):
        (hs_dir / f"hs_{i}.safetensors").symlink_to(files[f"hs_{row}.safetensors"].resolve())
    rows = [all_rows[i] for i in picked]
    Dataset.from_dict(
        {
            "input_ids": [r["input_ids"] for r in rows],
            "loss_mask": [r["loss_mask"] for r in rows],
            "seq_len": [len(r["input_ids"]) for r in rows],
        }
    ).with_format("torch").save_to_disk(str(data_dir))
    return data_dir


def kept_hidden_states(run_dir, key: str) -> Path:
    """Hybrid mode's folder of kept samples for these hidden states (`key`: the plan, dtype,
    rows and target); folders kept for other hidden states are stale and removed."""
    # Lazy: it imports speculators' dataset module, which only online and hybrid runs use.
    from eaglenest.hidden_states.online import remove_pending

    root = Path(run_dir).resolve() / ".eaglenest" / "hidden_states_kept"
    for stale in root.iterdir() if root.exists() else ():
        if stale.name != key:
            log.info("removing hidden states kept for an earlier spec: %s", stale)
            shutil.rmtree(stale)
    folder = root / key
    folder.mkdir(parents=True, exist_ok=True)
    remove_pending(folder)
    log.info("hybrid: %d samples already kept in %s", len(list(folder.glob("hs_*.safetensors"))), folder)
    return folder


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
