"""What a GPU node's first run relies on, checked on CPU: the GPUs a job sees against the
config's `gpus`, before any rank or server starts."""

from __future__ import annotations

import json

import pytest
import torch

from eaglenest.core.errors import EaglenestError
from eaglenest.planning.run_estimate import job_gpus
from eaglenest.training.with_server import gpu_split


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


def _server_flags(spec) -> list[str]:
    return [a for a in spec.args if a.startswith("--")]


def test_on_one_shared_gpu_the_online_server_leaves_the_trainer_its_share(monkeypatch, tmp_path):
    """vLLM takes 0.9 of a GPU by default: on the one GPU online training shares with the
    server, the server is held to hidden_states.shared_gpu_server_memory, after the user's own
    vllm.extra_args (vLLM reads the last); on GPUs of its own it keeps what they say."""
    from types import SimpleNamespace

    from eaglenest.training.with_server import online_server_spec

    plan = {"aux_layer_ids": [1, 2, 3], "target_num_layers": 6}
    server_cfg = {"env": {}, "base_args": ["--gpu-memory-utilization", "0.90"], "device": "cuda"}
    target = SimpleNamespace(path="t")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    spec, trainer = online_server_spec(tmp_path, target, plan, server_cfg, "bfloat16", 1, None, 0.4)
    assert trainer == "3" and dict(spec.env)["CUDA_VISIBLE_DEVICES"] == "3"
    flags = list(spec.args)
    last = len(flags) - 1 - flags[::-1].index("--gpu-memory-utilization")
    assert flags[last + 1] == "0.4" and last > flags.index("--gpu-memory-utilization")

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    spec, trainer = online_server_spec(tmp_path, target, plan, server_cfg, "bfloat16", 2, None, 0.4)
    assert trainer == "1" and _server_flags(spec).count("--gpu-memory-utilization") == 1
    assert "0.4" not in spec.args


def test_the_plan_checks_the_target_fits_the_servers_share_of_a_shared_gpu():
    from eaglenest.planning.run_estimate import gpu_memory_check

    cfg = {"gpus": 1, "gpu_memory_gb": 80, "vllm": {"device": "cuda"}, "hidden_states": {"mode": "online"}}
    shared = gpu_memory_check(cfg, int(50e9))  # 50 GB of weights: 100 GB at half of a GPU
    assert shared["memory_utilization"] == 0.5 and shared["fits"] is False
    alone = gpu_memory_check({**cfg, "hidden_states": {"mode": "offline"}}, int(50e9))
    assert alone["memory_utilization"] == 0.9 and alone["fits"] is True
    cfg["hidden_states"]["shared_gpu_server_memory"] = 0.7
    assert gpu_memory_check(cfg, int(50e9))["fits"] is True


def test_the_job_takes_the_first_gpus_it_was_given(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert gpu_split(4, 1) == ("4", "5,6,7")


def yarn_target(tmp_path, drop=(), **text):
    """A Kimi-K2.5-shaped config.json: a DeepSeek-V3 text model with YaRN in the legacy keys."""
    text_config = {
        "model_type": "deepseek_v3",
        "vocab_size": 1280,
        "hidden_size": 64,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096,
        "rope_theta": 50000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 1024,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        **text,
    }
    for key in drop:
        del text_config[key]
    folder = tmp_path / "target"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "kimi_k25",
                "architectures": ["KimiK25ForConditionalGeneration"],
                "text_config": text_config,
            }
        )
    )
    return folder, text_config


def test_the_draft_keeps_the_targets_yarn_as_transformers_reads_it(tmp_path):
    from transformers import DeepseekV3Config, LlamaConfig

    from eaglenest.draft.config import draft_config_stage

    folder, text = yarn_target(tmp_path)
    cfg = draft_config_stage(
        folder, tmp_path / "draft.json", aux_layer_ids=None, draft_vocab_size=64, max_position_embeddings=2048
    )
    reference = DeepseekV3Config(**{k: v for k, v in text.items() if k != "model_type"}).rope_parameters
    assert cfg["rope_parameters"] == {k: v for k, v in reference.items() if k != "type"}
    # The trainer's config class reads it as the target's YaRN, not a default rope.
    assert (
        LlamaConfig(**{k: v for k, v in cfg.items() if k != "eaglenest"}).rope_parameters["rope_type"]
        == "yarn"
    )
    assert cfg["max_position_embeddings"] == 4096
    derived = cfg["eaglenest"]["derived"]
    assert "head_dim" in derived and "rope_scaling and rope_theta" in derived["rope_parameters"]


def test_a_target_shape_the_draft_cannot_take_is_refused(tmp_path):
    from eaglenest.draft.config import draft_config_stage

    folder, _ = yarn_target(tmp_path, rope_scaling={"type": "mrope", "mrope_section": [8, 12, 12]})
    with pytest.raises(EaglenestError, match=r"config.json: the target uses multimodal rope"):
        draft_config_stage(folder, tmp_path / "d.json", aux_layer_ids=None, draft_vocab_size=64)
    assert not (tmp_path / "d.json").exists()
    (tmp_path / "target").rename(tmp_path / "old")
    folder, _ = yarn_target(tmp_path, drop=["rms_norm_eps"])
    with pytest.raises(EaglenestError, match=r"config.json: the target's text config has no rms_norm_eps"):
        draft_config_stage(folder, tmp_path / "d.json", aux_layer_ids=None, draft_vocab_size=64)


def test_at_tensor_parallel_a_draft_is_judged_against_ngrams_noise_floor():
    from eaglenest.evaluation.figures import judge_against_noise_floor, ngram_identical_fraction

    answers = {("held_out", "default", str(i), 0): {"token_ids": [i], "text": "t"} for i in range(32)}
    # n-gram (lossless by construction) differs on 6 of 32 prompts: the engine's own noise.
    ngram = [
        {"method": "ngram", "id": str(i), "token_ids": [i if i >= 6 else -1], "text": "t"} for i in range(32)
    ]
    floor = ngram_identical_fraction(ngram, answers)
    assert floor == 26 / 32
    results = {
        "ngram": {"identical_fraction": floor, "lossless": False},
        "draft": {"identical_fraction": 24 / 32, "lossless": False},
        "untrained_draft": {"identical_fraction": 10 / 32, "lossless": False},
    }
    judge_against_noise_floor(results, floor, 32)
    assert results["draft"]["lossless"] and not results["draft"]["lossless_bit_exact"]
    assert not results["untrained_draft"]["lossless"]  # far below the floor: a speculation bug
    assert results["ngram"] == {"identical_fraction": floor, "lossless": False}


@pytest.mark.engine
def test_the_gpu_training_benchmark_trains_resumes_and_exports_at_tiny_shapes(tmp_path):
    """benchmarks/bench_gpu_training.py, the script a GPU machine without vLLM runs, as the
    suite can run it: on CPU at tiny shapes, killed after its first epoch and resumed."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu_training.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--shape", "tiny", "--samples", "8", "--workdir", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout
    assert proc.returncode == 0, (out + proc.stderr)[-4000:]
    checks = [line for line in out.splitlines() if line.startswith(("ok  ", "FAIL"))]
    assert len(checks) == 4 and all(line.startswith("ok  ") for line in checks), out
    assert "resumed from epoch 0, trained epoch 1 only" in out
