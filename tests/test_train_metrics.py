"""Per-epoch training curves: every epoch recorded, not only those speculators kept as best."""

import json
import logging
from pathlib import Path

import pytest
import yaml
from conftest import trainer_inputs

from eaglenest.training.metrics import EpochMetricsFile, collect_metrics, plot_curves

REPO = Path(__file__).resolve().parents[1]


def _log_epoch(logger, epoch, train_losses, val_loss):
    for loss in train_losses:
        logger.info({"train": {"loss": loss, "full_acc_0": loss / 10}, "epoch": epoch, "lr": 1e-3})
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
    assert [r["train_steps"] for r in rows] == [2, 3]
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


def test_trainer_command_uses_a_standalone_rendezvous_on_several_gpus():
    from eaglenest.training.trainer import trainer_args, trainer_command

    args = trainer_args(
        **trainer_inputs(),
        hp={
            "epochs": 1,
            "lr": 1e-3,
            "optimizer": "adamw",
            "ttt_steps": 3,
            "total_seq_len": 64,
            "dtype": "float32",
            "train_data_ratio": 0.9,
            "num_workers": 0,
            "seed": 0,
        },
        cpu=False,
        trust_remote_code=True,
    )
    cmd = trainer_command(args, gpus=8)
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=8"]
    assert "torch.distributed.run" not in trainer_command(args, gpus=1)
    # The remote-code flag reaches speculators, and a mask token spares it the processor: read
    # back by speculators' own resolver (its defaults are False and None).
    from speculators.train.config import TrainConfig

    resolved = TrainConfig.resolve(args).flatten()
    assert (resolved["trust_remote_code"], resolved["mask_token_id"]) == (True, 0)


def whole_checkpoint(folder, size: int = 1000):
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file({"w": torch.zeros(size)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}")
    torch.save({"step": 1}, folder / "optimizer_state_dict.pt")


def test_a_finished_training_prunes_superseded_specs_and_its_earlier_epochs(tmp_path):
    """A sweep of 4 variants, each retrained once with a new setting: the old specs' folders go,
    other variants' stay, and of the finished spec only its last epoch is kept."""
    from eaglenest.training.checkpoints import OWNER_FILE, epochs_done, prune_after_training

    train = tmp_path / ".eaglenest" / "train"
    outputs = [tmp_path / "variants" / f"v{i}" / "train" / "checkpoint" for i in range(4)]
    for i, out in enumerate(outputs):
        for spec in (f"old{i}", f"new{i}"):
            work = train / spec
            for epoch in range(3):
                whole_checkpoint(work / "checkpoints" / str(epoch))
                (work / "checkpoints" / f"epoch{epoch}_end").symlink_to(
                    str(epoch)
                )  # as speculators links them
            (work / "checkpoints" / "checkpoint_best").symlink_to("1")
            (work / OWNER_FILE).write_text(json.dumps({"output": str(out.resolve()), "spec": spec}))
    shard = tmp_path / "hidden_states" / "hs_0.safetensors"  # trained-on data: linked, never deleted
    shard.parent.mkdir()
    shard.write_bytes(b"x" * 100)
    (train / "new0" / "data").mkdir()
    (train / "new0" / "data" / "hs_0.safetensors").symlink_to(shard)

    def held():
        return sum(f.stat().st_size for f in train.rglob("*") if f.is_file() and not f.is_symlink())

    before = held()
    freed = prune_after_training(train / "new0", train / "new0" / "checkpoints", outputs[0])
    assert sorted(p.name for p in train.iterdir()) == ["new0", "new1", "new2", "new3", "old1", "old2", "old3"]
    assert epochs_done(train / "new0" / "checkpoints") == [2]
    assert sorted(p.name for p in (train / "new0" / "checkpoints").iterdir()) == ["2", "epoch2_end"]
    assert freed == before - held() > 0 and shard.read_bytes() == b"x" * 100


@pytest.mark.parametrize(("engines", "expected"), [(["vllm"], True), (["vllm", "sglang"], False)])
def test_a_run_exported_to_sglang_trains_the_form_sglangs_forward_computes(engines, expected):
    """speculators' own parser reads the trainer's flags: norm_before_residual is its default
    (true) for vLLM alone, false when the draft is exported to SGLang too."""
    from speculators.train.config.resolution import build_parser
    from speculators.train.config.schema import DraftArgs

    from eaglenest.training.sweep import train_settings
    from eaglenest.training.trainer import trainer_args

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["export"] = {"engines": engines}
    args = trainer_args(**trainer_inputs(), hp=train_settings(config), cpu=True)
    parsed = vars(build_parser().parse_args(args))  # a flag left out is absent: the schema's default
    assert (
        parsed.get("norm_before_residual", DraftArgs.model_fields["norm_before_residual"].default) is expected
    )


def test_the_slurm_profiles_memory_comment_counts_speculators_prefetched_batches():
    """profiles/slurm sizes train_draft's memory and /dev/shm from speculators' DataLoader
    prefetch (it once assumed 2 where speculators prefetches 4): the figure the comment uses is
    the trainer's default."""
    import re

    from speculators.train.config.schema import DataArgs

    text = (REPO / "profiles" / "slurm" / "config.yaml").read_text()
    prefetch = int(re.search(r"speculators' (\d+) prefetched batches", text).group(1))
    assert prefetch == DataArgs.model_fields["prefetch_factor"].default
    assert f"8 x 4 x {prefetch} x 0.47" in text
