"""Hidden states served while the draft trains (`hidden_states.mode` online and hybrid).

speculators' trainer already generates a missing sample's hidden states from a vLLM endpoint
(`--on-missing generate`): its dataset sends the row's token ids to the server, loads the file
the server's connector wrote, validates it and deletes it. Two things it lacks are added by a
subclass of that dataset, which the trainer process installs
(eaglenest.training.speculators_internals.use_served_dataset):

- the run's server requires its own key (eaglenest.engine.server) and serves the target under its own
  name; speculators always sends "EMPTY" and expects the verifier's path as the name;
- hybrid mode keeps each generated sample in the stored dtype (`hidden_states.dtype`), as
  `hs_{row}.safetensors` in the folder the trainer reads cached samples from, so later epochs,
  and a resumed run, read it back instead of extracting again. A file the engine wrote in that
  dtype is hard-linked (no copy); another is converted once. Either is written beside its
  final name and renamed there only once speculators has validated the sample.

Both settings travel in the environment, which torchrun's ranks and spawned data-loader workers
inherit; the subclass reaches the workers by reference to this module.
"""

from __future__ import annotations

import os
from pathlib import Path

import openai
from speculators.train.data import ArrowDataset

from eaglenest.hidden_states.extract import DTYPES, FP8, stored_tensors

KEY_ENV = "EAGLENEST_SERVER_KEY"
KEEP_ENV = "EAGLENEST_KEEP_GENERATED"
PENDING_SUFFIX = ".pending"


class KeepGenerated:
    """speculators' file transfer, keeping each valid generated sample, in `dtype`, as the
    cached file of its row. The dataset names the row (`file_idx`) before loading and calls
    `keep()` once the sample passed speculators' checks, or `discard()` when it did not."""

    def __init__(self, inner, dtype: str):
        self.inner, self.dtype = inner, dtype
        self.file_idx: int | None = None
        self.pending: Path | None = None

    @property
    def hidden_states_path(self) -> Path:
        return Path(self.inner.hidden_states_path)

    def setup(self) -> None:
        self.inner.setup()

    def get_cached(self, file_idx: int):
        return self.inner.get_cached(file_idx)

    def get_generated(self, params: dict):
        sample = self.inner.get_generated(params)  # waits for the engine's write lock
        if sample is not None and self.file_idx is not None:
            from safetensors.torch import save_file

            self.discard()
            self.pending = self.hidden_states_path / f"hs_{self.file_idx}.safetensors{PENDING_SUFFIX}"
            # fp8: the engine's connector wrote it quantized (the sample here is dequantized).
            if self.dtype == FP8 or sample["hidden_states"].dtype == DTYPES[self.dtype]:
                os.link(params.get("hidden_states_path") or params["handle"], self.pending)
            else:
                hidden, ids = sample["hidden_states"], sample["token_ids"]
                save_file(stored_tensors(hidden, ids, self.dtype), str(self.pending))
        return sample

    def delete(self, handle: str) -> None:
        self.inner.delete(handle)

    def keep(self) -> None:
        if self.pending is not None:
            os.replace(self.pending, self.pending.with_suffix(""))
            self.pending = None

    def discard(self) -> None:
        if self.pending is not None:
            self.pending.unlink(missing_ok=True)
            self.pending = None


class ServedDataset(ArrowDataset):
    """speculators' dataset, sending the run server's key and (hybrid) keeping what it extracts.

    Each of speculators' names it overrides or calls, with its parameters, is registered in
    eaglenest.training.speculators_internals.INTERNALS, checked before the trainer starts (a
    test holds that list to the methods overridden here)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if os.environ.get(KEEP_ENV):  # the stored dtype
            self.transfer = KeepGenerated(self.transfer, os.environ[KEEP_ENV])

    def _setup_client(self) -> None:
        key = os.environ.get(KEY_ENV)
        if not key:
            return super()._setup_client()
        client = openai.OpenAI(base_url=self.vllm_endpoint, api_key=key, max_retries=0)
        # The server serves the target under eaglenest's own name, not the verifier's path.
        self.model = client.models.list().data[0].id
        self.transfer.setup()
        self.client = client

    def _get_raw_data(self, index: int):
        if isinstance(self.transfer, KeepGenerated):
            self.transfer.file_idx = self._map_to_file_idx(index)
        return super()._get_raw_data(index)

    def _generate_hidden_states_once(self, dataset_item, client_item):
        try:
            sample = super()._generate_hidden_states_once(dataset_item, client_item)
        except BaseException:
            if isinstance(self.transfer, KeepGenerated):
                self.transfer.discard()
            raise
        if isinstance(self.transfer, KeepGenerated):
            self.transfer.keep()
        return sample


def remove_pending(folder) -> None:
    """Drop links a killed trainer left before their sample was validated."""
    for f in Path(folder).glob(f"hs_*.safetensors{PENDING_SUFFIX}"):
        f.unlink()
