"""Each name inside speculators that eaglenest patches, overrides or calls exists in the installed
version with the parameters eaglenest expects; one that moved or changed stops the trainer stage
by name, before training, instead of a patch failing mid-training."""

from __future__ import annotations

import inspect
import re

import pytest

from eaglenest.core.errors import EaglenestError
from eaglenest.training import speculators_internals
from eaglenest.training.speculators_internals import INTERNALS, check_internals, internal_problems


def test_every_registered_name_exists_with_the_parameters_eaglenest_expects():
    assert internal_problems() == []
    check_internals()


def test_a_missing_name_stops_the_trainer_stage_naming_it(monkeypatch):
    import speculators.train.data as data

    monkeypatch.delattr(data.ArrowDataset, "_generate_hidden_states_once")
    assert internal_problems() == [
        "speculators.train.data:ArrowDataset._generate_hidden_states_once "
        "(hybrid: overridden to keep or discard a sample) is missing"
    ]
    with pytest.raises(
        EaglenestError,
        match=r"speculators 0\.9\.0 \(torch .*\) differs from what eaglenest, written for speculators "
        r"0\.9\.0, relies on: speculators\.train\.data:ArrowDataset\._generate_hidden_states_once "
        r"\(hybrid: overridden to keep or discard a sample\) is missing",
    ):
        check_internals()


def test_a_changed_signature_is_reported_with_what_was_found_and_expected(monkeypatch):
    import speculators.train.cli as cli
    import speculators.train.data as data

    monkeypatch.setattr(cli, "setup_metric_logger", lambda loggers, output_dir: None)
    monkeypatch.setattr(data.ArrowDataset, "_map_to_file_idx", lambda self, index, split: 0)
    expected = [
        "speculators.train.cli:setup_metric_logger (wrapped to record each epoch's metrics) takes "
        "(loggers, output_dir) where eaglenest expects (loggers, run_name, output_dir)",
        "speculators.train.data:ArrowDataset._map_to_file_idx (hybrid: called to name that row) takes "
        "(self, index, split) where eaglenest expects (self, index)",
    ]
    assert internal_problems() == expected
    with pytest.raises(EaglenestError, match="; ".join(re.escape(p) for p in expected)):
        check_internals()


def test_a_module_needing_an_absent_package_is_checked_only_where_that_package_is(monkeypatch):
    """speculators' fused loss imports Triton, which a CPU machine lacks."""
    monkeypatch.setitem(
        INTERNALS, "eaglenest_absent_module", {"f": speculators_internals.Internal("probe", ())}
    )
    monkeypatch.setitem(speculators_internals.NEEDS, "eaglenest_absent_module", "eaglenest_absent_package")
    assert internal_problems() == []
    monkeypatch.setitem(speculators_internals.NEEDS, "eaglenest_absent_module", "json")  # installed
    assert internal_problems() == ["eaglenest_absent_module:f (probe) is missing"]


def test_the_patches_keep_each_patched_name_s_parameters(monkeypatch):
    """A check run after the patches (in the trainer process, or a later test) still passes."""
    import speculators.train.checkpointer as checkpointer
    import speculators.train.cli as cli
    import speculators.train.trainer as trainer
    import torch

    # Registered with monkeypatch, so each patch below is undone after the test.
    for owner, name in (
        (trainer, "get_local_rank"),
        (trainer.Trainer, "__init__"),
        (checkpointer, "get_current_device"),
        (torch.accelerator, "synchronize"),
        (cli, "setup_metric_logger"),
    ):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: None)
    speculators_internals.patch_for_cpu()
    speculators_internals.call_after_metric_logger_setup(lambda: None)
    assert trainer.get_local_rank() == "cpu" and checkpointer.get_current_device() == "cpu"
    assert torch.accelerator.synchronize() is None
    assert internal_problems() == []


def test_the_metric_logger_set_up_is_followed_by_the_callback(monkeypatch):
    import speculators.train.cli as cli

    calls = []
    monkeypatch.setattr(
        cli, "setup_metric_logger", lambda loggers, run_name, output_dir: calls.append("setup")
    )
    speculators_internals.call_after_metric_logger_setup(lambda: calls.append("then"))
    cli.setup_metric_logger([], "run", "out")
    assert calls == ["setup", "then"]


def test_every_speculators_method_served_dataset_overrides_or_calls_is_registered():
    """ServedDataset stays beside the hidden-state code (a layer below this registry), so this
    holds the registry to what it overrides and calls."""
    from speculators.train.data import ArrowDataset

    from eaglenest.hidden_states.online import ServedDataset

    overridden = {n for n in vars(ServedDataset) if hasattr(ArrowDataset, n) and not n.startswith("__")}
    called = set(re.findall(r"\b(?:self|super\(\))\.(_[^_]\w*)\(", inspect.getsource(ServedDataset)))
    assert overridden == {"_setup_client", "_get_raw_data", "_generate_hidden_states_once"}
    assert "_map_to_file_idx" in called
    registered = INTERNALS["speculators.train.data"]
    assert {f"ArrowDataset.{n}" for n in overridden | called} <= registered.keys()
    assert "ArrowDataset" in registered  # its constructor, which ServedDataset passes everything on to
    for name in overridden:
        # An override takes what speculators passes it.
        assert (
            tuple(inspect.signature(getattr(ServedDataset, name)).parameters)
            == registered[f"ArrowDataset.{name}"].params
        )


def test_use_served_dataset_installs_it_in_speculators_data_loaders(monkeypatch):
    import speculators.train.dataloader as dataloader

    from eaglenest.hidden_states.online import ServedDataset

    monkeypatch.setattr(dataloader, "ArrowDataset", dataloader.ArrowDataset)
    speculators_internals.use_served_dataset()
    assert dataloader.ArrowDataset is ServedDataset
