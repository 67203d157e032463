"""The target model as one artifact: a local folder, or a Hugging Face id resolved to a snapshot.

Every stage reads the target through this module, so a hub id, a local folder and the tiny
target the workflow builds all look the same downstream:

- `resolve_target` (the `resolve_target` rule) turns the configured target into a local folder
  (a hub id goes through huggingface_hub: `HF_HOME`/`HF_HUB_CACHE`, `HF_HUB_OFFLINE` and tokens
  from the environment are respected) and writes `target.json`: the folder, the resolved commit,
  the file list and the model's shape. Every later stage takes that record as input, so a new
  snapshot revision reruns exactly the stages that depend on the target;
- `text_config` / `read_shape`: vocabulary size, hidden size and layer count, read from the
  text model of a multimodal config (Kimi-K2.5 nests a DeepSeek-V3 model under `text_config`);
- `load_tokenizer`: the tokenizer as the target ships it, remote code included, so tokenize
  sees the ids vLLM serves.

`cache_key_file` and `cache_status` read the local cache only: planning never touches the
network.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import read_json, write_json

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


# --------------------------------------------------------------------------------------------
# Names and the local hub cache (no network)


def is_hub_id(path: str) -> bool:
    """A Hugging Face id ('org/name') that is not an existing local path."""
    return not Path(path).exists() and not path.startswith((".", "/", "~")) and bool(HUB_ID.match(path))


def on_hub(path: str, built_as: str | None = None) -> bool:
    """Whether the target resolves through the hub cache: a hub id the workflow does not build,
    or the Kimi miniature it publishes there (`built_as`: build_tiny.architecture, None when
    nothing is built). A tiny Llama is built into its folder, whatever that path looks like."""
    if built_as:
        return built_as == "kimi_k25"
    return is_hub_id(path)


def check_target(path: str, built_here: bool) -> None:
    """A target is a folder (existing or built by the workflow) or a Hugging Face id."""
    if built_here or Path(path).exists() or is_hub_id(path):
        return
    raise EaglenestError("target path does not exist (and is not a Hugging Face id 'org/name')", path)


# Every folder a builder writes (the stand-ins, a GGUF import) carries this marker, naming the
# builder: the proof that the folder is the builder's to replace. A folder without it (a user's
# model) is never touched. The names are the builders' modules as they were before the package
# had subfolders, kept so that folders built then are still recognised as eaglenest's.
BUILD_MARKER = "eaglenest_target.json"
BUILDERS = {
    "llama": "eaglenest.tiny_target",
    "kimi_k25": "eaglenest.kimi_mini",
    "gguf": "eaglenest.gguf_target",
}
# The config key that asks for each build, for the messages.
BUILD_KEYS = {"llama": "target.build_tiny", "kimi_k25": "target.build_tiny", "gguf": "target.gguf"}


def built_by(folder) -> str | None:
    """The builder a folder's marker names; None when it has no readable marker."""
    marker = Path(folder) / BUILD_MARKER
    try:
        return json.loads(marker.read_text()).get("built_by")
    except (OSError, ValueError, AttributeError):
        return None


def check_build_destination(target: str, kind: str, cache_dir=None) -> None:
    """Refuse a build (`kind`: a BUILDERS key) that would replace files its builder did not write.

    Run at planning, before Snakemake deletes a job's old outputs, and again by the builder.
    The tiny Llama and a GGUF import replace the folder target.path names; the Kimi miniature
    repoints the hub cache's `refs/` of target.path. Each is allowed only over the builder's own
    earlier output (its marker), or where nothing is yet."""
    builder, key = BUILDERS[kind], BUILD_KEYS[kind]
    if kind == "kimi_k25":
        _check_cache_repo_is_built_by(builder, target, cache_dir)
        return
    folder = Path(target)
    if not folder.exists():
        return
    if not folder.is_dir():
        raise EaglenestError(f"{key} builds a model folder here, but this is a file", folder)
    if not any(folder.iterdir()):
        return
    found = built_by(folder)
    if found != builder:
        why = f"no {BUILD_MARKER} of its own" if found is None else f"its {BUILD_MARKER} names {found}"
        raise EaglenestError(
            f"{key} would replace this folder, but it holds files {builder} did not write "
            f"({why}); nothing was deleted. Point target.path at a new folder to build the target "
            f"there, or remove {key} to train a draft for the model in it",
            folder,
        )


def _check_cache_repo_is_built_by(builder: str, repo_id: str, cache_dir) -> None:
    """Every snapshot of the cached repository, and every ref's commit, is `builder`'s."""
    repo = repo_cache_folder(repo_id, cache_dir)
    snapshots = {s.name: s for s in sorted((repo / "snapshots").glob("*"))}
    refs = sorted(f for f in (repo / "refs").rglob("*") if f.is_file())
    foreign = [(s, f"no {BUILD_MARKER} of its own") for s in snapshots.values() if built_by(s) != builder]
    foreign += [
        (r, "it names a snapshot the builder did not publish")
        for r in refs
        if r.read_text().strip() not in snapshots
    ]
    if foreign:
        item, why = foreign[0]
        raise EaglenestError(
            f"target.build_tiny would publish the miniature as {repo_id} into this hub cache, but "
            f"{item.relative_to(repo)} is not {builder}'s ({why}): "
            "it would repoint the cached model's refs; nothing was changed. Use another "
            "target.path or target.cache_dir, or remove target.build_tiny to use the cached model",
            repo,
        )


def hub_cache_dir(cache_dir=None) -> Path:
    """The hub cache in use: the configured folder, else huggingface_hub's own
    (`HF_HUB_CACHE`, else `HF_HOME/hub`)."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def repo_cache_folder(repo_id: str, cache_dir=None) -> Path:
    """Where huggingface_hub keeps a model repository: `models--ORG--NAME`."""
    return hub_cache_dir(cache_dir) / ("models--" + repo_id.replace("/", "--"))


def cache_key_file(repo_id: str, revision: str | None, cache_dir=None) -> Path:
    """The cache file that changes when a new revision of the target lands: `refs/BRANCH` for a
    branch or tag (huggingface_hub rewrites it only when the commit changes), the snapshot's
    `config.json` for a pinned commit."""
    revision = revision or "main"
    repo = repo_cache_folder(repo_id, cache_dir)
    if COMMIT.match(revision):
        return repo / "snapshots" / revision / "config.json"
    return repo / "refs" / revision


def cached_commit(repo_id: str, revision: str | None, cache_dir=None) -> str | None:
    """The commit the cache holds for `revision`, or None when it holds none."""
    key = cache_key_file(repo_id, revision, cache_dir)
    if not key.exists():
        return None
    return revision if key.name == "config.json" else key.read_text().strip()


def cache_status(repo_id: str, revision: str | None, cache_dir=None) -> dict:
    """Whether the target is in the local cache, at which commit, and its bytes there."""
    commit = cached_commit(repo_id, revision, cache_dir)
    snapshot = repo_cache_folder(repo_id, cache_dir) / "snapshots" / (commit or "-")
    cached = commit is not None and (snapshot / "config.json").exists()
    size = sum(f.stat().st_size for f in snapshot.rglob("*") if f.is_file()) if cached else None
    return {
        "cached": cached,
        "commit": commit,
        "snapshot": str(snapshot) if cached else None,
        "cache_dir": str(hub_cache_dir(cache_dir)),
        "bytes": size,
    }


# --------------------------------------------------------------------------------------------
# Config: the text model of a multimodal target


def text_config(config: dict) -> dict:
    """The language model's config: the `text_config` of a multimodal model (Kimi-K2.5,
    Llava-style), else the config itself. The one place that knows about nesting."""
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) else config


@dataclass(frozen=True)
class TargetShape:
    """What the pipeline needs to know of the target's language model."""

    vocab_size: int | None
    hidden_size: int | None
    num_layers: int | None
    model_type: str
    architectures: tuple[str, ...]
    multimodal: bool


def read_config(model_dir) -> tuple[dict, Path]:
    path = Path(model_dir)
    path = path / "config.json" if path.is_dir() or not path.suffix else path
    config = read_json(path)
    if not isinstance(config, dict):
        raise EaglenestError("expected a JSON object (a model config)", path)
    return config, path


SHAPE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers")


def read_shape(model_dir, require=SHAPE_KEYS) -> TargetShape:
    """Vocabulary size, hidden size and layer count of the target's text model; a key in
    `require` that is missing or not a positive integer is an error naming the file."""
    config, path = read_config(model_dir)
    tcfg = text_config(config)
    where = "text_config." if tcfg is not config else ""
    values = {}
    for key in SHAPE_KEYS:
        value = tcfg.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            if key in require:
                raise EaglenestError(f"{where}{key} must be a positive integer (got {value!r})", path)
            value = None
        values[key] = value
    return TargetShape(
        vocab_size=values["vocab_size"],
        hidden_size=values["hidden_size"],
        num_layers=values["num_hidden_layers"],
        model_type=str(config.get("model_type", "")),
        architectures=tuple(config.get("architectures") or ()),
        multimodal=tcfg is not config,
    )


# --------------------------------------------------------------------------------------------
# Resolving: the `resolve_target` rule


@dataclass(frozen=True)
class Target:
    """The resolved target, as `target.json` records it."""

    name: str  # as configured: a folder or a hub id
    path: str  # the local folder every engine loads (a hub snapshot for a hub id)
    source: str  # "hub" or "local"
    revision: str | None  # as configured
    commit: str | None  # the snapshot's commit (hub ids)
    trust_remote_code: bool
    files: list
    shape: dict

    @property
    def hub_id(self) -> str | None:
        return self.name if self.source == "hub" else None


def _download(repo_id: str, revision: str | None, cache_dir) -> Path:
    """The snapshot folder; fetched only where the network is allowed (`HF_HUB_OFFLINE`)."""
    from huggingface_hub import constants, snapshot_download

    offline = constants.HF_HUB_OFFLINE
    try:
        return Path(
            snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=offline)
        )
    except Exception as e:  # huggingface_hub raises many types; the user needs the message
        how = (
            "HF_HUB_OFFLINE is set, so only the local cache was searched: download it there "
            f"first (`hf download {repo_id}`) or unset HF_HUB_OFFLINE"
            if offline
            else "check the id, the revision and your token (HF_TOKEN)"
        )
        raise EaglenestError(
            f"cannot get {repo_id} (revision {revision or 'main'}) into the "
            f"hub cache {hub_cache_dir(cache_dir)}: {type(e).__name__}: {e}. "
            f"{how}"
        ) from None


def download_stage(*, repo_id: str, revision: str | None, cache_dir=None) -> Path:
    """The `download_target` rule: bring the snapshot into the hub cache."""
    return _download(repo_id, revision, cache_dir)


def _check_complete(folder: Path) -> list[tuple[str, int]]:
    """The snapshot's files; a missing config, weight file or weight shard is an error."""
    if not (folder / "config.json").exists():
        raise EaglenestError("target folder has no config.json", folder)
    files = sorted(
        (str(f.relative_to(folder)), f.stat().st_size)
        for f in folder.rglob("*")
        if f.is_file() and ".cache" not in f.parts
    )
    for index in folder.glob("*.safetensors.index.json"):
        missing = sorted(
            {s for s in read_json(index).get("weight_map", {}).values() if not (folder / s).exists()}
        )
        if missing:
            raise EaglenestError(
                f"{len(missing)} weight shards named in {index.name} are "
                f"missing (e.g. {missing[0]}): an interrupted download?",
                folder,
            )
    if not any(name.endswith(WEIGHT_SUFFIXES) for name, _ in files):
        raise EaglenestError("target folder holds no weight files", folder)
    return files


def resolve_target(
    name: str, *, revision: str | None = None, cache_dir=None, trust_remote_code: bool = False
) -> Target:
    """A local folder as it is, a hub id through the hub cache (downloading where allowed)."""
    if Path(name).exists():
        folder, source, commit = Path(name).resolve(), "local", None
    elif is_hub_id(name):
        folder, source = _download(name, revision, cache_dir), "hub"
        commit = folder.name if COMMIT.match(folder.name) else None
    else:
        check_target(name, built_here=False)
        raise AssertionError("unreachable")
    files = _check_complete(folder)
    check_remote_code(folder, trust_remote_code)  # before hours of regeneration, not after
    return Target(
        name=name,
        path=str(folder),
        source=source,
        revision=revision,
        commit=commit,
        trust_remote_code=trust_remote_code,
        files=[list(f) for f in files],
        shape=asdict(read_shape(folder)),
    )


def resolve_stage(*, name: str, revision, cache_dir, trust_remote_code: bool, out_record) -> dict:
    """The `resolve_target` rule: resolve and record."""

    target = resolve_target(name, revision=revision, cache_dir=cache_dir, trust_remote_code=trust_remote_code)
    record = asdict(target)
    write_json(out_record, record)
    logging.getLogger(__name__).info(
        "target %s -> %s (%s%s): %d files, %.1f MB; text model %s",
        name,
        target.path,
        target.source,
        f" commit {target.commit}" if target.commit else "",
        len(target.files),
        sum(s for _, s in target.files) / 1e6,
        target.shape,
    )
    return record


def load_target(record_path) -> Target:
    """The resolved target from `target.json`; its folder must still exist."""

    record = read_json(record_path)
    try:
        target = Target(**record)
    except TypeError as e:
        raise EaglenestError(f"not a target record ({e}); rerun resolve_target", record_path) from None
    if not Path(target.path).is_dir():
        raise EaglenestError(
            f"the target folder {target.path} is gone (hub cache cleaned?); rerun resolve_target", record_path
        )
    return target


# --------------------------------------------------------------------------------------------
# The tokenizer as the target ships it


def check_remote_code(model_dir, trust_remote_code: bool) -> None:
    """A tokenizer that ships as remote code (`auto_map` in tokenizer_config.json) needs
    `trust_remote_code`. Without it transformers does not fail: it converts Kimi's
    `tiktoken.model` into a fast tokenizer with another split pattern, whose ids differ from
    the ones the model was trained on. So refuse, naming the key."""
    path = Path(model_dir) / "tokenizer_config.json"
    if trust_remote_code or not path.exists():
        return
    try:
        auto_map = json.loads(path.read_text()).get("auto_map") or {}
    except (ValueError, AttributeError):
        return  # transformers will say what is wrong with the file
    if "AutoTokenizer" in auto_map:
        raise EaglenestError(
            "the tokenizer ships as remote code (auto_map.AutoTokenizer): set "
            "target.trust_remote_code: true, or transformers builds a different "
            "tokenizer than the target's",
            path,
        )


def load_tokenizer(model_dir, trust_remote_code: bool = False):
    """The target's tokenizer, fast, slow or remote code: the one vLLM serves with."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise EaglenestError("target model directory does not exist", model_dir)
    check_remote_code(model_dir, trust_remote_code)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    except Exception as e:  # transformers raises many types; the user needs the message
        raise EaglenestError(f"cannot load the tokenizer: {type(e).__name__}: {e}", model_dir) from None


def keep_caches_in(run_dir) -> None:
    """Remote code that transformers copies out (HF_MODULES_CACHE) goes into the run's own
    folder, so a run leaves nothing in ~/.cache. Call before importing transformers."""
    os.environ.setdefault(
        "HF_MODULES_CACHE", str(Path(run_dir).resolve() / ".eaglenest" / "cache" / "hf_modules")
    )


# --------------------------------------------------------------------------------------------
# Publishing a locally built model into a hub cache (the miniature targets, tests)


def publish_to_hub_cache(folder, repo_id: str, cache_dir=None, branch: str = "main") -> str:
    """Lay `folder` into the hub cache as huggingface_hub's download would: content-addressed
    `blobs/`, `snapshots/COMMIT/` of relative links, and `refs/BRANCH` written last. The commit
    is a hash of the files, so an identical build publishes the same revision. Returns it."""

    folder = Path(folder)
    repo = repo_cache_folder(repo_id, cache_dir)
    files = sorted(f for f in folder.rglob("*") if f.is_file())
    digests = {}
    for f in files:
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        digests[f] = h.hexdigest()
    commit = hashlib.sha1(
        "".join(f"{f.relative_to(folder)}\0{d}\n" for f, d in digests.items()).encode()
    ).hexdigest()
    snapshot = repo / "snapshots" / commit
    for f, digest in digests.items():
        blob = repo / "blobs" / digest
        if not blob.exists():
            blob.parent.mkdir(parents=True, exist_ok=True)
            tmp = blob.with_name(blob.name + ".incomplete")
            shutil.copyfile(f, tmp)
            os.replace(tmp, blob)
        link = snapshot / f.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    ref = repo / "refs" / branch
    ref.parent.mkdir(parents=True, exist_ok=True)
    if not ref.exists() or ref.read_text().strip() != commit:  # as the hub client: only on change
        tmp = ref.with_name(f".{branch}.tmp")
        tmp.write_text(commit)
        os.replace(tmp, ref)
    return commit
