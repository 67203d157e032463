"""What a GPU node's first run relies on, checked on CPU: the GPUs a job sees against the
config's `gpus`, before any rank or server starts."""

from __future__ import annotations

import pytest
import torch

from eaglenest.errors import EaglenestError
from eaglenest.run_estimate import job_gpus
from eaglenest.train import gpu_split


def test_a_job_with_fewer_gpus_than_the_config_is_refused_naming_both(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(
        EaglenestError, match=r"config gpus is 8, but this job sees 2 GPU\(s\) \(CUDA_VISIBLE_DEVICES='0,1'\)"
    ):
        job_gpus(8)
    assert job_gpus(2) == ["0", "1"]


def test_without_cuda_visible_devices_the_gpus_torch_sees_count(monkeypatch):
    """The local executor sets no CUDA_VISIBLE_DEVICES: the node's GPUs are what torch counts,
    never a range invented from the config."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    with pytest.raises(EaglenestError, match=r"sees 4 GPU\(s\) \(torch.cuda.device_count\(\)\)"):
        gpu_split(8, None)
    assert gpu_split(4, None) == ("0,1", "2,3")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert gpu_split(1, None) == ("0", "0")  # one GPU, shared by the server and the trainer


def test_the_job_takes_the_first_gpus_it_was_given(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert gpu_split(4, 1) == ("4", "5,6,7")
