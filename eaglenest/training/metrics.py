"""Per-epoch training metrics: recorded from speculators' metric log while the trainer runs,
read back and plotted as curves once it is done.

Its own module because two processes use it: the trainer's child process records the metrics
(`python -m eaglenest.training.train` attaches `EpochMetricsFile`) and the stage reads them.
They come from the metric log because speculators writes `val_metrics.json` only into
checkpoints that improved the validation loss, so curves read from checkpoints would silently
skip the epochs that did not.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from eaglenest.core.io import atomic_path, iter_jsonl
from eaglenest.draft.algorithms import position_accuracies
from eaglenest.training.speculators_internals import call_after_metric_logger_setup

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
