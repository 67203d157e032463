"""Every name inside speculators (and torch) that eaglenest patches, overrides or calls beyond
its command line, with the signature eaglenest expects of it, checked before a trainer starts;
and the patches themselves.

eaglenest drives speculators 0.9.0's trainer through its CLI, and reaches past it for these:

- `patch_for_cpu`: running on a CPU. speculators 0.9.0 assumes an accelerator for the model's
  device, the step timer's synchronize, autocast's device type and the resume checkpoint's
  device.
- `patch_fused_loss_configs`: torch.compile tracing both of speculators' fused-loss Triton
  kernels, which share one autotune configs list.
- `call_after_metric_logger_setup`: recording each epoch's metrics
  (eaglenest.training.metrics.record_epoch_metrics), after speculators has set its metric logger up.
- `use_served_dataset`: online and hybrid, a dataset that sends the run server's key and keeps
  what it extracts (eaglenest.hidden_states.online.ServedDataset, a subclass of speculators'
  dataset that stays beside the rest of the hidden-state code, below this layer).

None of these names is speculators' public API; several are gone from its main branch. Where one
is missing or takes other parameters, a patch would fail late or, worse, an override would
silently stop being called: the trainer stage refuses to start instead, naming what changed.
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.util
import inspect
import logging
from dataclasses import dataclass
from importlib.metadata import version

from eaglenest.core.errors import EaglenestError

# The parameters speculators 0.9.0's dataset takes: ServedDataset passes all of them on, and
# speculators' data loaders build whichever class stands in speculators.train.dataloader with them.
ARROW_DATASET_PARAMS = (
    "max_len",
    "datapath",
    "transfer",
    "vllm_endpoint",
    "on_missing",
    "train_ratio",
    "split",
    "hidden_states_dtype",
    "model",
    "request_timeout",
    "max_retries",
    "generation_validation_retries",
    "max_consecutive_generation_failures",
)


@dataclass(frozen=True)
class Internal:
    use: str  # what eaglenest does with it
    # Its parameter names in order, as inspect.signature gives them (a class: its constructor's);
    # None where eaglenest neither calls, wraps nor overrides it (checked by name only).
    params: tuple[str, ...] | None


# module -> attribute path within it -> Internal
INTERNALS = {
    "speculators.train.trainer": {
        "get_local_rank": Internal("CPU: replaced to answer 'cpu'", ()),
        "Trainer.__init__": Internal(
            "CPU: wrapped to set device_type 'cpu'", ("self", "model", "config", "train_loader", "val_loader")
        ),
    },
    "speculators.train.checkpointer": {
        "get_current_device": Internal("CPU: replaced, so resuming loads onto the CPU", ()),
    },
    "speculators.train.cli": {
        "setup_metric_logger": Internal(
            "wrapped to record each epoch's metrics", ("loggers", "run_name", "output_dir")
        ),
        "main": Internal("the trainer's entry point, called with TrainConfig.resolve's result", ("cfg",)),
    },
    "speculators.train.config": {
        "TrainConfig.resolve": Internal("parses the trainer's command line", ("argv",)),
        "TrainConfig.flatten": Internal("the resolved settings, recorded in the run's provenance", ("self",)),
        "TrainConfig.provenance": Internal("which settings are defaults, recorded beside them", None),
    },
    "speculators.train.dataloader": {
        "ArrowDataset": Internal("online/hybrid: replaced by ServedDataset", ARROW_DATASET_PARAMS),
    },
    "speculators.train.data": {
        "ArrowDataset": Internal("online/hybrid: subclassed by ServedDataset", ARROW_DATASET_PARAMS),
        "ArrowDataset._setup_client": Internal(
            "online/hybrid: overridden to send the server's key", ("self",)
        ),
        "ArrowDataset._get_raw_data": Internal(
            "hybrid: overridden to name the row being extracted", ("self", "index")
        ),
        "ArrowDataset._map_to_file_idx": Internal("hybrid: called to name that row", ("self", "index")),
        "ArrowDataset._generate_hidden_states_once": Internal(
            "hybrid: overridden to keep or discard a sample", ("self", "dataset_item", "client_item")
        ),
    },
    "speculators.losses.fused": {
        "loss_forward_kernel.configs": Internal("copied per kernel so torch.compile traces both", None),
        "loss_backward_kernel.configs": Internal("copied per kernel so torch.compile traces both", None),
    },
    "torch.accelerator": {"synchronize": Internal("CPU: replaced by a no-op", ("device",))},
}

# Modules that import only where another package does (fused: Triton, absent on a CPU machine):
# checked only where that package is installed.
NEEDS = {"speculators.losses.fused": "triton"}


_ABSENT = object()


def parameter_names(obj) -> tuple[str, ...] | None:
    """obj's parameter names in order, as inspect.signature gives them; None where it has none."""
    try:
        return tuple(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return None


def internal_problems() -> list[str]:
    """What the installed speculators (or torch) lacks or has changed of INTERNALS, one line
    each, naming module:attribute, what eaglenest does with it and, for a changed signature,
    the parameters found and those expected."""
    problems = []
    for module_name, names in INTERNALS.items():
        needs = NEEDS.get(module_name)
        if needs and importlib.util.find_spec(needs) is None:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            module = _ABSENT
        for name, internal in names.items():
            obj = module
            for part in name.split("."):
                obj = getattr(obj, part, _ABSENT)
            where = f"{module_name}:{name} ({internal.use})"
            if obj is _ABSENT:
                problems.append(f"{where} is missing")
            elif internal.params is not None and (found := parameter_names(obj)) != internal.params:
                shown = "no signature" if found is None else f"({', '.join(found)})"
                problems.append(
                    f"{where} takes {shown} where eaglenest expects ({', '.join(internal.params)})"
                )
    return problems


def check_internals() -> None:
    """Raise where the installed speculators (or torch) lacks or changed a name in INTERNALS."""
    problems = internal_problems()
    if problems:
        raise EaglenestError(
            f"speculators {version('speculators')} (torch {version('torch')}) differs from what eaglenest, "
            "written for speculators 0.9.0, relies on: "
            + "; ".join(problems)
            + ". Install the versions envs/requirements-*.txt and envs/constraints-*.txt pin"
        )


def patch_for_cpu() -> None:
    """Let speculators 0.9.0's trainer run without an accelerator.

    1. `Trainer` moves the model and batches to `get_local_rank()` (an accelerator index):
       make that `"cpu"`.
    2. Its step timer calls `torch.accelerator.synchronize()`: a no-op without one.
    3. Autocast falls back to device type "cuda" when no accelerator exists: use "cpu".
    4. Resuming loads the checkpoint onto `get_current_device()`, which answers "cuda:0"
       without an accelerator (and then needs pinned memory): load onto "cpu".

    Each replacement keeps the original's parameters, so `check_internals` still passes once
    patched.
    """
    import speculators.train.checkpointer as checkpointer_mod
    import speculators.train.trainer as trainer_mod
    import torch

    if torch.accelerator.current_accelerator() is not None:
        return
    trainer_mod.get_local_rank = lambda: "cpu"
    checkpointer_mod.get_current_device = lambda: "cpu"
    torch.accelerator.synchronize = functools.wraps(torch.accelerator.synchronize)(lambda *a, **k: None)
    original_init = trainer_mod.Trainer.__init__

    @functools.wraps(original_init)
    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.device_type = "cpu"

    trainer_mod.Trainer.__init__ = init


def patch_fused_loss_configs() -> None:
    """Give each of speculators' fused-loss Triton kernels its own autotune configs.

    speculators 0.9.0 decorates `loss_forward_kernel` and `loss_backward_kernel` with one
    `triton.autotune(...)` object, so both autotuners hold the same `configs` list (and the
    same Config objects). torch.compile (torch 2.11's dynamo) traces both kernels in the
    compiled metrics function and refuses the second sight of that list: "ListVariable ... is
    already tracked for mutation". A copy per kernel, equal in value, lets it trace them.
    """
    try:
        from speculators.losses import fused
    except ImportError:  # no Triton: the eager loss, nothing to trace
        return
    for name in ("loss_forward_kernel", "loss_backward_kernel"):
        kernel = getattr(fused, name, None)
        if isinstance(getattr(kernel, "configs", None), list):
            kernel.configs = copy.deepcopy(kernel.configs)


def call_after_metric_logger_setup(then) -> None:
    """Make speculators' trainer call `then()` right after it sets its metric logger up: that
    set-up replaces the logger's handlers, so one added before it would be dropped."""
    import speculators.train.cli as cli_mod

    setup = cli_mod.setup_metric_logger

    @functools.wraps(setup)
    def setup_then(*args, **kwargs):
        setup(*args, **kwargs)
        then()

    cli_mod.setup_metric_logger = setup_then


def use_served_dataset() -> None:
    """Make speculators' data loaders build `ServedDataset` (in the trainer process)."""
    import speculators.train.dataloader as dataloader

    # Lazy: it imports speculators' dataset module, which only online and hybrid runs use.
    from eaglenest.hidden_states.online import ServedDataset

    dataloader.ArrowDataset = ServedDataset
    # The OpenAI client logs every request at INFO: a line per sample per epoch in the log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
