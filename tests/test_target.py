"""The target as one artifact: hub ids through the hub cache, nested text configs, one reader."""

import hashlib
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
    target = resolve_target(REPO_ID, cache_dir=cache)
    assert target.source == "hub" and target.commit == commit
    assert Path(target.path) == cache / f"models--eaglenest-test--nested/snapshots/{commit}"
    assert (Path(target.path) / "config.json").is_symlink()  # as the hub client lays it out
    assert target.shape["vocab_size"] == 1280 and target.hub_id == REPO_ID
    assert sorted(name for name, _ in target.files) == ["config.json", "model.safetensors"]
    status = cache_status(REPO_ID, None, cache)
    assert status["cached"] and status["commit"] == commit and status["bytes"] > 64


def test_a_hub_cache_under_a_dot_cache_folder_resolves(tmp_path):
    """The hub's default cache is ~/.cache/huggingface: a snapshot there is the user's model, its
    weights found, however the folders above it are named (only the snapshot's own .cache is
    the hub client's download state)."""
    cache = tmp_path / ".cache" / "huggingface" / "hub"
    commit = publish_to_hub_cache(model_folder(tmp_path / "m", NESTED), REPO_ID, cache)
    target = resolve_target(REPO_ID, cache_dir=cache)
    assert target.commit == commit
    assert sorted(name for name, _ in target.files) == ["config.json", "model.safetensors"]


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
    commit = publish_to_hub_cache(model_folder(tmp_path / "m", NESTED), REPO_ID, cache)
    record = tmp_path / "target.json"
    resolve_stage(name=REPO_ID, revision=commit, cache_dir=cache, trust_remote_code=True, out_record=record)
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
    (folder / "tokenization_kimi.py").write_text("class TikTokenTokenizer: ...\n")
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


# Remote code: only from a pinned commit, only as the hub served it.

TOKENIZER_CODE = "from .helpers import SPLIT\n\n\nclass Tok:\n    pattern = SPLIT\n"
HELPER_CODE = "SPLIT = r'\\w+'\n"


def remote_code_model(path: Path) -> Path:
    """A model whose tokenizer ships as remote code in two files, one importing the other."""
    folder = model_folder(path, NESTED)
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["tokenization_test.Tok", None]}})
    )
    (folder / "tokenization_test.py").write_text(TOKENIZER_CODE)
    (folder / "helpers.py").write_text(HELPER_CODE)
    (folder / "unused.py").write_text("raise SystemExit\n")  # named by nothing: not imported
    return folder


def test_remote_code_from_a_branch_stops_before_import_naming_the_commit_to_pin(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    commit = publish_to_hub_cache(remote_code_model(tmp_path / "m"), REPO_ID, cache)
    monkeypatch.setenv("EAGLENEST_CONFIG_FILES", "config/mine.yaml")
    record = tmp_path / "target.json"
    for revision in (None, "main"):
        with pytest.raises(
            EaglenestError,
            match=rf"{REPO_ID} runs remote code .* set target.revision: {commit} in config/mine.yaml",
        ):
            resolve_stage(
                name=REPO_ID, revision=revision, cache_dir=cache, trust_remote_code=True, out_record=record
            )
        assert not record.exists()
    # Pinned, it resolves, and the record names each file the tokenizer imports with its hash.
    resolve_stage(name=REPO_ID, revision=commit, cache_dir=cache, trust_remote_code=True, out_record=record)
    code = {f["file"]: f for f in load_target(record).remote_code}
    assert set(code) == {"tokenization_test.py", "helpers.py"}
    assert code["helpers.py"]["sha256"] == hashlib.sha256(HELPER_CODE.encode()).hexdigest()
    assert code["tokenization_test.py"]["named_by"] == "tokenizer_config.json auto_map.AutoTokenizer"
    assert code["helpers.py"]["named_by"] == "imported by tokenization_test.py"
    # Following the branch is a choice the config makes; the hashes are recorded all the same.
    resolve_stage(
        name=REPO_ID, revision=None, cache_dir=cache, trust_remote_code=True, out_record=record,
        allow_unpinned_remote_code=True,
    )  # fmt: skip
    assert len(load_target(record).remote_code) == 2


def test_remote_code_edited_in_the_cache_is_refused_before_import(tmp_path):
    cache = tmp_path / "hub"
    commit = publish_to_hub_cache(remote_code_model(tmp_path / "m"), REPO_ID, cache)
    record = tmp_path / "target.json"
    resolve_stage(name=REPO_ID, revision=commit, cache_dir=cache, trust_remote_code=True, out_record=record)
    snapshot = Path(load_target(record).path)
    # Edited in place: the link still names the blob the hub served, whose content changed.
    (snapshot / "helpers.py").resolve().write_text("SPLIT = 'anything'\nimport os\n")
    with pytest.raises(
        EaglenestError, match=r"helpers.py: remote code changed since resolve_target .*target.json"
    ):
        load_target(record)
    with pytest.raises(EaglenestError, match=r"helpers.py: this remote-code file does not match the blob"):
        resolve_target(REPO_ID, revision=commit, cache_dir=cache, trust_remote_code=True)


def test_a_non_lfs_file_is_checked_against_gits_blob_id_as_the_hub_names_it(tmp_path):
    """The hub cache names a small file's blob by git's id of its content, not its sha256."""
    from eaglenest.target.resolve import check_as_downloaded, git_blob_sha1, remote_code_files

    folder = remote_code_model(tmp_path / "m")
    snapshot = tmp_path / "snap"
    (tmp_path / "blobs").mkdir()
    snapshot.mkdir()
    for f in folder.iterdir():
        blob = tmp_path / "blobs" / git_blob_sha1(f)
        blob.write_bytes(f.read_bytes())
        (snapshot / f.name).symlink_to(blob)
    # git's own id of a file holding "hello\n" (git hash-object)
    (tmp_path / "hello").write_text("hello\n")
    assert git_blob_sha1(tmp_path / "hello") == "ce013625030ba8dba906f756967f9e9ca394464a"
    code = remote_code_files(snapshot)
    check_as_downloaded(snapshot, code)
    (snapshot / "tokenization_test.py").resolve().write_text("class Tok: pass\n")
    with pytest.raises(EaglenestError, match="does not match the blob the hub served"):
        check_as_downloaded(snapshot, remote_code_files(snapshot))


def test_remote_code_from_another_repository_or_missing_is_refused(tmp_path):
    folder = remote_code_model(tmp_path / "m")
    (folder / "config.json").write_text(
        json.dumps({**NESTED, "auto_map": {"AutoConfig": "other/repo--configuration_x.Cfg"}})
    )
    with pytest.raises(
        EaglenestError, match=r"config.json: auto_map.AutoConfig names code in another repository"
    ):
        resolve_target(str(folder), trust_remote_code=True)
    (folder / "config.json").write_text(
        json.dumps({**NESTED, "auto_map": {"AutoConfig": "configuration_x.Cfg"}})
    )
    with pytest.raises(
        EaglenestError,
        match=r"config.json auto_map.AutoConfig names configuration_x.py, which the model does not ship",
    ):
        resolve_target(str(folder), trust_remote_code=True)


# The download: the hub's listing first, refused before a byte is fetched.

MB = 1_000_000


def hub_model_info(commit: str, files: dict[str, tuple[int, str | None]]):
    """The hub's file listing (GET /api/models/ID/revision/REV?blobs=true) as huggingface_hub parses
    it: name -> (size, sha256 of an LFS file, or None for a small file listed by its git blob id)."""
    from huggingface_hub.hf_api import ModelInfo

    siblings = [
        {"rfilename": name, "size": size, "blobId": hashlib.sha1(name.encode()).hexdigest()}
        | ({"lfs": {"sha256": lfs, "size": size, "pointerSize": 134}} if lfs else {})
        for name, (size, lfs) in files.items()
    ]
    return ModelInfo(id=REPO_ID, sha=commit, siblings=siblings)


@pytest.fixture
def online_hub(monkeypatch):
    """huggingface_hub online, its listing faked, and any fetch recorded (none may happen)."""
    from huggingface_hub import HfApi, constants

    import eaglenest.target.resolve as resolve

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    fetched = []
    monkeypatch.setattr(resolve, "_download", lambda *a, **k: fetched.append(a) or Path("/nonexistent"))
    hub = {"commit": "c" * 40, "files": {}}
    monkeypatch.setattr(HfApi, "model_info", lambda self, repo_id, revision=None, files_metadata=False: (
        hub_model_info(hub["commit"], hub["files"])))  # fmt: skip
    return hub, fetched


def test_a_download_larger_than_the_free_space_is_refused_before_fetching(tmp_path, monkeypatch, online_hub):
    import eaglenest.target.resolve as resolve

    hub, fetched = online_hub
    shards = {f"model-0000{i}-of-00004.safetensors": (300 * MB, f"{i}" * 64) for i in range(1, 5)}
    hub["files"] = {"config.json": (2_000, None), **shards}
    cache = tmp_path / "hub"
    monkeypatch.setattr(resolve, "free_bytes", lambda folder: 1_000 * MB)
    with pytest.raises(EaglenestError) as refused:
        resolve.download_stage(repo_id=REPO_ID, revision=None, cache_dir=cache, disk_margin_gb=0.1)
    message = str(refused.value)
    assert message.startswith(f"{cache}: no room to download {REPO_ID}")
    assert "1,200,002,000 bytes" in message and "1,000,000,000 bytes" in message and "100.00 MB" in message
    assert fetched == [] and not cache.exists()
    # What the cache already holds is not fetched again: two shards there, one half there.
    blobs = resolve.repo_cache_folder(REPO_ID, cache) / "blobs"
    blobs.mkdir(parents=True)
    for i in (1, 2):
        (blobs / (f"{i}" * 64)).touch()
    with open(blobs / ("3" * 64 + ".incomplete"), "wb") as f:
        f.truncate(150 * MB)
    assert resolve.bytes_to_fetch(REPO_ID, resolve.hub_listing(REPO_ID, None)[1], cache) == 450 * MB + 2_000
    resolve.download_stage(repo_id=REPO_ID, revision=None, cache_dir=cache, disk_margin_gb=0.1)
    assert len(fetched) == 1


def test_an_unpinned_remote_code_download_is_refused_before_fetching(tmp_path, online_hub):
    import eaglenest.target.resolve as resolve

    hub, fetched = online_hub
    hub["files"] = {"config.json": (2_000, None), "tokenization_kimi.py": (9_000, None)}
    with pytest.raises(EaglenestError, match=f"set target.revision: {hub['commit']}"):
        resolve.download_stage(repo_id=REPO_ID, revision="main", cache_dir=tmp_path, trust_remote_code=True)
    assert fetched == []
    resolve.download_stage(
        repo_id=REPO_ID, revision=hub["commit"], cache_dir=tmp_path, trust_remote_code=True
    )
    assert len(fetched) == 1
