"""Per-epoch training curves: every epoch recorded, not only those speculators kept as best."""

import json
import logging

import pytest

from eaglenest.train import EpochMetricsFile, collect_metrics, plot_curves


def _log_epoch(logger, epoch, train_losses, val_loss):
    for loss in train_losses:
        logger.info({"train": {"loss": loss, "full_acc_0": loss / 10}, "epoch": epoch,
                     "lr": 1e-3})
    logger.info({"val": {"loss_epoch": val_loss, "full_acc_0_epoch": 0.5}, "epoch": epoch})


def test_each_epoch_records_its_training_mean_and_validation(tmp_path):
    path = tmp_path / "epoch_metrics.jsonl"
    logger = logging.getLogger("test.speculators.metrics")
    logger.setLevel(logging.INFO)
    handler = EpochMetricsFile(path)
    logger.addHandler(handler)
    try:
        logger.info("a plain message is not a metric record")
        _log_epoch(logger, 0, [4.0, 2.0], 3.5)
        _log_epoch(logger, 1, [1.0, 2.0, 3.0], 3.9)  # validation got worse: still recorded
    finally:
        logger.removeHandler(handler)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [0, 1]
    assert rows[0]["train"] == pytest.approx({"loss_epoch": 3.0, "full_acc_0_epoch": 0.3})
    assert rows[1]["train"]["loss_epoch"] == 2.0
    assert rows[1]["val"] == {"loss_epoch": 3.9, "full_acc_0_epoch": 0.5}


def test_an_epoch_rerun_after_an_interrupt_keeps_its_last_record(tmp_path):
    path = tmp_path / "epoch_metrics.jsonl"
    first, rerun = EpochMetricsFile(path), EpochMetricsFile(path)
    for handler, epochs, val in ((first, [0, 1], 9.0), (rerun, [1, 2], 1.0)):
        logger = logging.getLogger(f"test.metrics.{id(handler)}")
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        for e in epochs:
            _log_epoch(logger, e, [1.0], val + e)
        logger.removeHandler(handler)
    rows = collect_metrics(path)
    assert [r["epoch"] for r in rows] == [0, 1, 2]
    assert [r["val"]["loss_epoch"] for r in rows] == [9.0, 2.0, 3.0]
    plot_curves(rows, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_no_record_yet_is_an_empty_history(tmp_path):
    assert collect_metrics(tmp_path / "missing.jsonl") == []
