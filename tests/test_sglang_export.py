"""The SGLang export, proven without SGLang (it installs only with CUDA): drafts made by
speculators' own model class, exported, then read back by a plain-Python statement of SGLang's
load rules and run through eaglenest's restatement of SGLang's forward; and the pinned sglang
wheel's source (downloaded from the package registry, not installed) checked for every name and
function those restate."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglenest.core.errors import EaglenestError
from eaglenest.draft import sglang as sglang_layers
from eaglenest.evaluation import sglang_contract as contract
from eaglenest.evaluation.sglang_export import (
    PARITY_TOLERANCE,
    export_sglang_stage,
    parity,
    renamed_for_sglang,
    sglang_config,
)

VOCAB, DRAFT_VOCAB, HIDDEN = 300, 100, 64
AUX = [2, 4, 6]  # HF hidden_states indices, as eaglenest and vLLM mean them
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
# Kimi-K2.5's kind of rope, with and without the mscale pair (SGLang scales cos/sin otherwise).
YARN = {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 32.0, "original_max_position_embeddings": 128,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}  # fmt: skip
YARN_PLAIN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "original_max_position_embeddings": 256,
}


def speculators_draft(
    folder: Path, *, rope=DEFAULT_ROPE, layers=1, norm_before_residual=False, **flags
) -> Path:
    """A draft saved by speculators 0.9.0's own Eagle3DraftModel, random weights (norms near 1),
    and a vocabulary mapping whose d2t and t2d agree, as eaglenest's vLLM export holds it."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    layer = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        max_position_embeddings=4096, rope_parameters=dict(rope),
    )  # fmt: skip
    verifier = VerifierConfig(name_or_path="target", architectures=["LlamaForCausalLM"])
    proposal = GreedyTokenProposalConfig(speculative_tokens=3)
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=DRAFT_VOCAB,
        norm_before_residual=norm_before_residual,
        eagle_aux_hidden_state_layer_ids=AUX,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[proposal],
            default_proposal_method="greedy",
            verifier=verifier,
        ),
        **flags,
    )
    model = Eagle3DraftModel(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if p.dim() == 1 else 0.0))
    model.save_pretrained(folder)
    weights = load_file(str(folder / "model.safetensors"))
    kept = torch.randperm(VOCAB, generator=g)[:DRAFT_VOCAB].sort().values
    weights["t2d"] = torch.zeros(VOCAB, dtype=torch.bool).index_fill_(0, kept, True)
    weights["d2t"] = kept - torch.arange(DRAFT_VOCAB)
    save_file(weights, str(folder / "model.safetensors"))
    return folder


def target(folder: Path, architecture="LlamaForCausalLM") -> SimpleNamespace:
    """A local target folder holding its config.json, as the resolved target names it."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": [architecture], "model_type": "llama", "vocab_size": VOCAB, "hidden_size": HIDDEN,
           "num_hidden_layers": 8, "num_attention_heads": 4, "intermediate_size": 128, "rms_norm_eps": 1e-6}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(cfg))
    return SimpleNamespace(path=str(folder), name=str(folder), hub_id=None, commit=None)


def loaded(draft: Path, architecture="LlamaForCausalLM"):
    """The export's config and what SGLang's loader makes of the renamed tensors."""
    vllm_cfg = json.loads((draft / "config.json").read_text())
    cfg = sglang_config(vllm_cfg, architecture, draft)
    tensors = renamed_for_sglang(load_file(str(draft / "model.safetensors")), cfg["num_hidden_layers"])
    return cfg, tensors, *contract.load_checkpoint(tensors, cfg)


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize(
    "flags",
    [{"norm_before_fc": True, "norm_output": True}, {"fc_norm": True}],
    ids=["norm_before_fc", "fc_norm"],
)
def test_sglangs_loader_fills_every_parameter_its_draft_reads_and_skips_no_key(tmp_path, layers, flags):
    draft = speculators_draft(tmp_path / "draft", layers=layers, **flags)
    cfg, tensors, params, hot_token_id, skipped = loaded(draft)
    assert skipped == []
    assert {k: tuple(v.shape) for k, v in params.items()} == contract.sglang_parameters(cfg)
    # q/k/v stacked in SGLang's order, and the draft-to-target ids SGLang derives from d2t.
    q = tensors["layers.0.self_attn.q_proj.weight"]
    assert torch.equal(params["model.layers.0.self_attn.qkv_proj.weight"][: len(q)], q)
    assert torch.equal(hot_token_id, torch.nonzero(tensors["t2d"]).flatten())


def test_a_key_sglang_would_skip_fails_the_export_and_leaves_no_folder(tmp_path):
    draft = speculators_draft(tmp_path / "draft")
    weights = load_file(str(draft / "model.safetensors"))
    weights["layers.0.self_attn.q_norm.weight"] = torch.ones(
        16
    )  # a Qwen3-style key: SGLang's Llama draft has none
    save_file(weights, str(draft / "model.safetensors"))
    out = tmp_path / "draft_sglang"
    with pytest.raises(EaglenestError, match=r"fails its keys check.*q_norm"):
        export_sglang_stage(draft, out, target=target(tmp_path / "target"))
    assert not out.exists()


@pytest.mark.parametrize(
    "rope", [DEFAULT_ROPE, YARN, YARN_PLAIN], ids=["default", "yarn", "yarn_without_mscale"]
)
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize(
    "flags",
    [
        {"norm_before_fc": True, "norm_output": True},
        {"fc_norm": True, "norm_before_fc": False, "norm_output": False},
    ],
    ids=["norm_before_fc+norm_output", "fc_norm"],
)
def test_sglangs_forward_restated_equals_speculators_draft_when_the_flags_match(
    tmp_path, rope, layers, flags
):
    draft = speculators_draft(tmp_path / "draft", rope=rope, layers=layers, **flags)
    cfg, _, params, _, _ = loaded(draft)
    result = parity(draft, params, cfg)
    assert result["ok"], result
    assert result["max_relative_logit_error"] <= PARITY_TOLERANCE and result["same_argmax"] == 1.0


def test_with_norm_before_residual_speculators_draft_computes_another_function(tmp_path):
    """speculators' default (norm_before_residual true) keeps the normalised state as the first
    layer's residual; SGLang's forward cannot: the same weights draft other logits there."""
    draft = speculators_draft(tmp_path / "draft", norm_before_residual=True)
    cfg, _, params, _, _ = loaded(draft)
    result = parity(draft, params, cfg)
    assert result["ok"] is False and result["max_relative_logit_error"] > 100 * PARITY_TOLERANCE, result


def test_the_export_writes_what_sglang_reads_and_records_its_checks(tmp_path):
    draft = speculators_draft(tmp_path / "draft", rope=YARN, norm_before_fc=True, norm_output=True)
    out = tmp_path / "draft_sglang"
    record = export_sglang_stage(draft, out, target=target(tmp_path / "target"), card=card_inputs(tmp_path))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    # A Llama target captures the input of layer id + 1: ids one lower than the HF indices.
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [a - 1 for a in AUX]
    assert cfg["target_hidden_size"] == HIDDEN and cfg["tie_word_embeddings"] is False
    assert cfg["draft_vocab_size"] == DRAFT_VOCAB and cfg["vocab_size"] == VOCAB
    assert cfg["rope_scaling"] == cfg["rope_parameters"] == YARN and cfg["rope_theta"] == YARN["rope_theta"]
    assert (cfg["norm_before_fc"], cfg["fc_norm"], cfg["norm_output"]) == (True, False, True)
    on_disk = json.loads((out / "eaglenest_export.json").read_text())
    assert on_disk == record and on_disk["sglang_version"] == sglang_layers.SGLANG_VERSION
    assert {name: check["ok"] for name, check in record["checks"].items()} == {
        "keys": True,
        "config": True,
        "parity": True,
    }
    assert set(load_file(str(out / "model.safetensors"))) == set(load_file(str(draft / "model.safetensors")))
    # The model card, as the hub reads one: metadata, the serve command, the trainer's figures.
    card = (out / "README.md").read_text()
    assert card.startswith("---\nbase_model: ") and "library_name: sglang" in card
    assert "--speculative-algorithm EAGLE3" in card and "--speculative-num-steps 3" in card
    assert "position 1: 0.412" in card and "position 3: 0.105" in card
    assert "1,234 conversations" in card and "norm_before_residual: False" in card


def card_inputs(folder: Path) -> dict:
    """What the export rules hand the model card: the trainer's metrics, tokenize's metadata,
    the vocabulary's coverage, the train settings, k."""
    val = {"full_acc_0_epoch": 0.412, "full_acc_1_epoch": 0.2, "full_acc_2_epoch": 0.105}
    files = {
        "metrics_path": {"per_epoch": [{"epoch": 0, "val": val}], "train_rows": 1100, "val_rows": 134},
        "metadata_path": {"samples_out": 1234, "tokens_total": 500000, "tokens_loss_masked": 300000},
        "coverage_path": {"draft_vocab_size": DRAFT_VOCAB, "target_vocab_size": VOCAB, "coverage": 0.97},
    }
    for key, content in files.items():
        (folder / f"{key}.json").write_text(json.dumps(content))
    hp = {"epochs": 1, "lr": 1e-3, "optimizer": "adamw", "ttt_steps": 3, "total_seq_len": 512}
    return {key: folder / f"{key}.json" for key in files} | {"hp": hp, "k": 3}


def test_a_kimi_target_keeps_its_ids_and_refuses_a_first_aux_layer_of_one(tmp_path):
    """SGLang's DeepSeek-V2/V3 targets (Kimi-K2.5 hands the call to one) capture the ids as they
    are, unless the first is 1."""
    for arch in ("KimiK25ForConditionalGeneration", "DeepseekV3ForCausalLM"):
        ids = sglang_layers.sglang_layer_ids([2, 30, 58], arch, "x")
        assert ids == [2, 30, 58] and sglang_layers.captured_layers(ids, arch) == [2, 30, 58]
        with pytest.raises(EaglenestError, match="first aux layer 1 is never captured"):
            sglang_layers.sglang_layer_ids([1, 30, 58], arch, "x")
    assert sglang_layers.captured_layers(
        sglang_layers.sglang_layer_ids([2, 15, 27], "LlamaForCausalLM", "x"), "LlamaForCausalLM"
    ) == [2, 15, 27]


def edit_config(draft: Path, **changes) -> Path:
    path = draft / "config.json"
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        node = cfg
        *parents, last = key.split("__")
        for name in parents:
            node = node[name]
        node[last] = value
    path.write_text(json.dumps(cfg))
    return draft


@pytest.mark.parametrize(
    ("changes", "architecture", "message"),
    [
        ({"norm_before_residual": True}, "LlamaForCausalLM", "norm_before_residual is true"),
        ({"transformer_layer_config__model_type": "qwen3"}, "LlamaForCausalLM", "draft architecture qwen3"),
        ({"speculators_model_type": "peagle"}, "LlamaForCausalLM", "algorithm peagle"),
        ({"embed_requires_grad": True}, "LlamaForCausalLM", "trained its embedding"),
        (
            {},
            "MistralForCausalLM",
            "no EAGLE-3 layer capture is known for the target architecture MistralForCausalLM",
        ),
        ({"eagle_aux_hidden_state_layer_ids": [1, 4, 6]}, "DeepseekV3ForCausalLM", "first aux layer 1"),
    ],
    ids=[
        "norm_before_residual",
        "qwen3_draft",
        "p_eagle",
        "trained_embedding",
        "unknown_target",
        "kimi_first_id_1",
    ],
)
def test_what_sglang_would_load_wrongly_is_refused_naming_the_file(tmp_path, changes, architecture, message):
    draft = edit_config(speculators_draft(tmp_path / "draft"), **changes)
    out = tmp_path / "draft_sglang"
    with pytest.raises(EaglenestError, match=message) as err:
        export_sglang_stage(draft, out, target=target(tmp_path / "target", architecture))
    assert str(draft / "config.json") in str(err.value)
    assert not out.exists()


@pytest.fixture(scope="module")
def sglang_wheel(tmp_path_factory) -> Path:
    """The pinned sglang wheel from the package registry, downloaded, never installed."""
    folder = tmp_path_factory.mktemp("sglang_wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
         "--python-version", "3.11", "-d", str(folder), f"sglang=={sglang_layers.SGLANG_VERSION}"],
        check=True, timeout=600,
    )  # fmt: skip
    (wheel,) = folder.glob("sglang-*.whl")
    return wheel


def test_the_pinned_sglang_still_says_what_the_contract_restates(sglang_wheel):
    """An sglang whose loader tables, config names or the functions the contract and the
    reference forward restate have changed fails here, naming what changed."""
    found = contract.read_wheel(sglang_wheel)
    assert sglang_layers.DRAFT_ARCHITECTURE in found["draft_classes"]
    assert found["stacked_params"] == contract.STACKED_PARAMS
    assert found["legacy_names"] == contract.LEGACY_NAMES
    assert found["config_names"] == contract.CONFIG_NAMES, found["config_names"] ^ contract.CONFIG_NAMES
    changed = {k: v for k, v in found["fingerprints"].items() if v != contract.FINGERPRINTS[k]}
    assert not changed, f"re-read these in sglang and update sglang_contract: {changed}"
    with zipfile.ZipFile(sglang_wheel) as z:
        for arch, (path, cls, _) in sglang_layers.AUX_LAYER_RULES.items():
            assert f"class {cls}(" in z.read(path).decode(), (arch, path, cls)


def test_the_drift_check_sees_a_changed_function(sglang_wheel, tmp_path):
    """The check is not blind: the same wheel with one line of the draft's forward changed."""
    changed = tmp_path / sglang_wheel.name
    read = {contract.DRAFT_SOURCE} | {key.split(":")[0] for key in contract.FINGERPRINTS}
    with zipfile.ZipFile(sglang_wheel) as src, zipfile.ZipFile(changed, "w") as dst:
        for item in (i for i in src.infolist() if i.filename in read):  # what read_wheel reads
            data = src.read(item)
            if item.filename == contract.DRAFT_SOURCE:
                data = data.replace(
                    b"residual = hidden_states\n", b"residual = self.hidden_norm(hidden_states)\n", 1
                )
            dst.writestr(item, data)
    found = contract.read_wheel(changed)["fingerprints"]
    key = f"{contract.DRAFT_SOURCE}:LlamaDecoderLayer.forward"
    assert found[key] != contract.FINGERPRINTS[key]
    assert all(v == contract.FINGERPRINTS[k] for k, v in found.items() if k != key)
