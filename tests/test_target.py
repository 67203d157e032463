"""The target as one artifact: hub ids through the hub cache, nested text configs, one reader."""

import json
import os
import re
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest
import torch
from conftest import folder_bytes

from eaglenest.core.errors import EaglenestError
from eaglenest.data.vocab import MappingPaths, build_vocab_mapping
from eaglenest.draft.config import draft_config_stage
from eaglenest.target.resolve import (
    cache_key_file,
    cache_status,
    is_hub_id,
    load_target,
    publish_to_hub_cache,
    read_shape,
    resolve_stage,
    resolve_target,
    text_config,
)

REPO_ID = "eaglenest-test/nested"

# A Kimi-K2.5-like wrapper: the text model's sizes differ from every top-level value, so a
# reader that looks at the wrong level gives a different answer.
NESTED = {
    "model_type": "kimi_k25",
    "architectures": ["KimiK25ForConditionalGeneration"],
    "vocab_size": 7,
    "hidden_size": 3,
    "text_config": {
        "model_type": "kimi_k2",
        "vocab_size": 1280,
        "hidden_size": 64,
        "num_hidden_layers": 8,
        "num_attention_heads": 2,
        "intermediate_size": 128,
        "rms_norm_eps": 1e-5,
    },
    "vision_config": {"hidden_size": 32, "num_hidden_layers": 1},
}


def model_folder(path: Path, config: dict, weights: bytes = b"\0" * 64) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(weights)
    return path


def test_text_config_is_read_from_the_nested_text_model(tmp_path):
    folder = model_folder(tmp_path / "m", NESTED)
    shape = read_shape(folder)
    assert (shape.vocab_size, shape.hidden_size, shape.num_layers) == (1280, 64, 8)
    assert shape.multimodal and shape.architectures == ("KimiK25ForConditionalGeneration",)
    plain = model_folder(tmp_path / "p", NESTED["text_config"])
    assert read_shape(plain).vocab_size == 1280 and not read_shape(plain).multimodal
    assert text_config(NESTED) is NESTED["text_config"]


def test_every_stage_takes_the_vocabulary_from_the_text_model(tmp_path):
    """Vocab mapping and the draft config (and through it training and export) agree."""
    folder = model_folder(tmp_path / "m", NESTED)
    freq = tmp_path / "token_freq.pt"
    torch.save(torch.arange(1280, dtype=torch.int64), freq)
    cov = build_vocab_mapping(freq, 64, MappingPaths.in_dir(tmp_path / "vocab"), target_config=folder)
    dcfg = draft_config_stage(folder, tmp_path / "draft_config.json", aux_layer_ids=None, draft_vocab_size=64)
    assert cov["target_vocab_size"] == dcfg["vocab_size"] == 1280
    assert np.load(tmp_path / "vocab" / "t2d.npy").shape == (1280,)
    assert dcfg["hidden_size"] == 64 and dcfg["eaglenest"]["aux_layer_ids"] == [2, 4, 5]


def test_a_config_without_sizes_is_refused_by_name(tmp_path):
    folder = model_folder(tmp_path / "m", {"text_config": {"vocab_size": 10}})
    with pytest.raises(EaglenestError, match=r"config.json: text_config.hidden_size"):
        read_shape(folder)


def test_hub_id_resolves_offline_from_the_cache(tmp_path):
    cache = tmp_path / "hub"
    commit = publish_to_hub_cache(model_folder(tmp_path / "m", NESTED), REPO_ID, cache)
    assert is_hub_id(REPO_ID) and not is_hub_id(str(tmp_path))
    assert cache_key_file(REPO_ID, None, cache).read_text() == commit
    target = resolve_target(REPO_ID, cache_dir=cache, trust_remote_code=True)
    assert target.source == "hub" and target.commit == commit
    assert Path(target.path) == cache / f"models--eaglenest-test--nested/snapshots/{commit}"
    assert (Path(target.path) / "config.json").is_symlink()  # as the hub client lays it out
    assert target.shape["vocab_size"] == 1280 and target.hub_id == REPO_ID
    assert sorted(name for name, _ in target.files) == ["config.json", "model.safetensors"]
    status = cache_status(REPO_ID, None, cache)
    assert status["cached"] and status["commit"] == commit and status["bytes"] > 64


def test_hub_id_resolves_through_hf_hub_cache_like_huggingface_hub(tmp_path, monkeypatch):
    """With no cache_dir, the cache is huggingface_hub's own: HF_HUB_CACHE is respected."""
    import huggingface_hub.constants as constants

    cache = tmp_path / "hub"
    publish_to_hub_cache(model_folder(tmp_path / "m", NESTED), REPO_ID, cache)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    assert resolve_target(REPO_ID).path.startswith(str(cache))


def test_a_new_revision_resolves_to_its_own_snapshot(tmp_path):
    cache = tmp_path / "hub"
    first = publish_to_hub_cache(model_folder(tmp_path / "a", NESTED), REPO_ID, cache)
    second = publish_to_hub_cache(model_folder(tmp_path / "b", NESTED, b"\1" * 64), REPO_ID, cache)
    assert first != second
    assert resolve_target(REPO_ID, cache_dir=cache).commit == second
    assert resolve_target(REPO_ID, revision=first, cache_dir=cache).commit == first
    # Publishing the same content again is the same revision: nothing downstream reruns.
    assert publish_to_hub_cache(tmp_path / "b", REPO_ID, cache) == second


def test_a_target_missing_from_the_offline_cache_says_what_to_do(tmp_path):
    with pytest.raises(
        EaglenestError,
        match=r"eaglenest-test/absent.*HF_HUB_OFFLINE is set.*"
        r"hf download eaglenest-test/absent",
    ):
        resolve_target("eaglenest-test/absent", cache_dir=tmp_path / "hub")
    with pytest.raises(EaglenestError, match="does not exist"):
        resolve_target("./no/such/folder")


def test_an_interrupted_download_is_refused(tmp_path):
    folder = model_folder(tmp_path / "m", NESTED)
    (folder / "model.safetensors.index.json").write_text(
        json.dumps(
            {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
        )
    )
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"\0")
    with pytest.raises(EaglenestError, match=r"1 weight shards .* missing .*00002-of-00002"):
        resolve_target(str(folder))


def test_the_record_is_what_every_stage_loads(tmp_path):
    cache = tmp_path / "hub"
    publish_to_hub_cache(model_folder(tmp_path / "m", NESTED), REPO_ID, cache)
    record = tmp_path / "target.json"
    resolve_stage(name=REPO_ID, revision=None, cache_dir=cache, trust_remote_code=True, out_record=record)
    target = load_target(record)
    assert target.trust_remote_code and target.shape["hidden_size"] == 64
    # The hub cache cleaned since: the record names itself and the step to rerun.
    for f in Path(target.path).iterdir():
        f.unlink()
    Path(target.path).rmdir()
    with pytest.raises(EaglenestError, match=r"target.json: .* is gone .*rerun resolve_target"):
        load_target(record)


def test_a_remote_code_tokenizer_without_trust_is_refused_when_resolving(tmp_path):
    """Without trust_remote_code transformers silently builds another tokenizer from Kimi's
    tiktoken.model: refuse at resolve_target, before hours of regeneration."""
    folder = model_folder(tmp_path / "m", NESTED)
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}})
    )
    with pytest.raises(
        EaglenestError, match=r"tokenizer_config.json: .*remote code.*target.trust_remote_code: true"
    ):
        resolve_target(str(folder))
    assert resolve_target(str(folder), trust_remote_code=True).trust_remote_code


# The stand-in builders replace what they built before, and nothing else.


def test_a_llama_build_goes_only_where_nothing_is_or_into_its_own_earlier_folder(tmp_path):
    from eaglenest.target.resolve import BUILD_MARKER, check_build_destination

    check_build_destination(str(tmp_path / "new"), "llama")  # nothing there yet
    (tmp_path / "empty").mkdir()
    check_build_destination(str(tmp_path / "empty"), "llama")
    own = model_folder(tmp_path / "own", {"model_type": "llama"})
    (own / BUILD_MARKER).write_text(json.dumps({"built_by": "eaglenest.tiny_target"}))
    check_build_destination(str(own), "llama")


@pytest.mark.parametrize(
    "marker, why",
    [
        (None, "no eaglenest_target.json of its own"),
        ({"built_by": "eaglenest.kimi_mini"}, "its eaglenest_target.json names eaglenest.kimi_mini"),
        ("not json", "no eaglenest_target.json of its own"),
    ],
)
def test_a_llama_build_refuses_a_folder_it_did_not_write_before_touching_it(tmp_path, marker, why):
    from eaglenest.target.resolve import BUILD_MARKER
    from eaglenest.target.tiny import build_tiny_target

    user = model_folder(tmp_path / "my-model", {"model_type": "llama"})
    (user / "tokenizer.json").write_text("{}")
    if marker is not None:
        (user / BUILD_MARKER).write_text(marker if isinstance(marker, str) else json.dumps(marker))
    before = folder_bytes(user)
    corpus = Path(__file__).resolve().parents[1] / "data" / "tiny_target" / "corpus.jsonl"
    with pytest.raises(EaglenestError, match=f"{user}: target.build_tiny would replace this folder.*{why}"):
        build_tiny_target(user, [corpus], pretrain_steps=0)
    assert folder_bytes(user) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-model"]  # no temporary folder left


def test_a_llama_build_refuses_a_file_at_the_target_path(tmp_path):
    from eaglenest.target.resolve import check_build_destination

    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    with pytest.raises(
        EaglenestError,
        match=re.escape("model.gguf: target.build_tiny builds a model folder here, but this is a file"),
    ):
        check_build_destination(str(tmp_path / "model.gguf"), "llama")


def test_the_miniature_is_published_only_into_a_cache_repo_of_its_own(tmp_path):
    from eaglenest.target.resolve import BUILD_MARKER, check_build_destination, repo_cache_folder

    cache = tmp_path / "hub"
    check_build_destination(REPO_ID, "kimi_k25", cache)  # no such repository cached
    built = model_folder(tmp_path / "built", NESTED)
    (built / BUILD_MARKER).write_text(json.dumps({"built_by": "eaglenest.kimi_mini"}))
    publish_to_hub_cache(built, REPO_ID, cache)
    check_build_destination(REPO_ID, "kimi_k25", cache)  # its own earlier build

    downloaded = model_folder(tmp_path / "downloaded", {**NESTED, "note": "the real one"})
    publish_to_hub_cache(downloaded, REPO_ID, cache, branch="v1")  # a snapshot without the marker
    repo = repo_cache_folder(REPO_ID, cache)
    before = folder_bytes(repo)
    with pytest.raises(
        EaglenestError,
        match=rf"{repo}: target.build_tiny would publish .* snapshots/\w+ is not eaglenest.kimi_mini's",
    ):
        check_build_destination(REPO_ID, "kimi_k25", cache)
    assert folder_bytes(repo) == before


def test_the_miniature_refuses_a_cache_whose_ref_names_a_snapshot_it_did_not_publish(tmp_path):
    from eaglenest.target.resolve import check_build_destination, repo_cache_folder

    refs = repo_cache_folder(REPO_ID, tmp_path) / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text("0" * 40)  # a download whose snapshot is gone or elsewhere
    with pytest.raises(EaglenestError, match=re.escape("refs/main is not eaglenest.kimi_mini's")):
        check_build_destination(REPO_ID, "kimi_k25", tmp_path)
