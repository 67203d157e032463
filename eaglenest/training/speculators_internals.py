"""The names inside speculators that eaglenest patches, overrides or calls beyond its command
line, in one place, checked before a trainer starts.

eaglenest drives speculators 0.9.0's trainer through its CLI, and reaches past it for four
things: running on a CPU (eaglenest.training.train.patch_for_cpu), recording each epoch's metrics
(eaglenest.training.train.record_epoch_metrics), and, online and hybrid, a dataset that sends the run
server's key and keeps what it extracts (eaglenest.hidden_states.online.ServedDataset). None of these
names is speculators' public API; several are gone from its main branch. Where one is missing,
a patch would fail late or, worse, an override would silently stop being called: the trainer
stage refuses to start instead, naming what moved.
"""

from __future__ import annotations

import importlib

from eaglenest.core.errors import EaglenestError

# module -> attribute paths within it, and what eaglenest does with each
INTERNALS = {
    "speculators.train.trainer": {
        "get_local_rank": "CPU: replaced to answer 'cpu'",
        "Trainer.__init__": "CPU: wrapped to set device_type 'cpu'",
    },
    "speculators.train.checkpointer": {"get_current_device": "CPU: replaced, so resuming loads onto the CPU"},
    "speculators.train.cli": {
        "setup_metric_logger": "wrapped to record each epoch's metrics",
        "main": "the trainer's entry point, called with TrainConfig.resolve's result",
    },
    "speculators.train.config": {"TrainConfig.resolve": "parses the trainer's command line"},
    "speculators.train.dataloader": {"ArrowDataset": "online/hybrid: replaced by ServedDataset"},
    "speculators.train.data": {
        "ArrowDataset._setup_client": "online/hybrid: overridden to send the server's key",
        "ArrowDataset._get_raw_data": "hybrid: overridden to name the row being extracted",
        "ArrowDataset._map_to_file_idx": "hybrid: called to name that row",
        "ArrowDataset._generate_hidden_states_once": "hybrid: overridden to keep or discard a sample",
    },
}


def missing_internals() -> list[str]:
    """The names of INTERNALS the installed speculators lacks, as module:attribute."""
    missing = []
    for module_name, names in INTERNALS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing += [f"{module_name}:{name}" for name in names]
            continue
        for name in names:
            obj = module
            for part in name.split("."):
                obj = getattr(obj, part, None)
            if obj is None:
                missing.append(f"{module_name}:{name}")
    return missing


def check_internals() -> None:
    missing = missing_internals()
    if missing:
        from importlib.metadata import version

        uses = {f"{m}:{n}": why for m, names in INTERNALS.items() for n, why in names.items()}
        raise EaglenestError(
            f"speculators {version('speculators')} lacks what eaglenest (written for 0.9.0) relies on: "
            + "; ".join(f"{name} ({uses[name]})" for name in missing)
            + ". Install the version envs/requirements-*.txt pins"
        )
