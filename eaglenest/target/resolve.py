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
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import file_record, free_bytes, human_bytes, read_json, write_json

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
    # The remote-code files the run imports, with their sha256 (`remote_code_files`); [] without
    # trust_remote_code. Checked again before every stage that may import them (`load_target`).
    remote_code: list = field(default_factory=list)

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


@dataclass(frozen=True)
class HubFile:
    """One file of a snapshot as the hub lists it: its size and the blob name the cache gives it."""

    name: str
    size: int
    blob: str  # sha256 for LFS files, git's blob sha1 for the others


def hub_listing(repo_id: str, revision: str | None) -> tuple[str, list[HubFile]]:
    """The commit `revision` names on the hub now, and its files with their sizes (the hub's
    file listing: no file is fetched)."""
    from huggingface_hub import HfApi

    try:
        info = HfApi().model_info(repo_id, revision=revision, files_metadata=True)
    except Exception as e:  # huggingface_hub raises many types; the user needs the message
        raise EaglenestError(
            f"cannot list {repo_id} (revision {revision or 'main'}) on the hub: "
            f"{type(e).__name__}: {e}. Check the id, the revision and your token (HF_TOKEN)"
        ) from None
    files = [
        HubFile(f.rfilename, int(f.size or 0), f.lfs.sha256 if f.lfs else (f.blob_id or ""))
        for f in info.siblings or []
    ]
    return info.sha, files


def bytes_to_fetch(repo_id: str, files: list[HubFile], cache_dir=None) -> int:
    """The listed bytes the cache does not hold yet: a blob already there (another revision's,
    an earlier download's) is not fetched again, and an interrupted one resumes."""
    blobs = repo_cache_folder(repo_id, cache_dir) / "blobs"
    needed = 0
    for f in {f.blob: f for f in files}.values():  # one blob, however many names share it
        if f.blob and (blobs / f.blob).exists():
            continue
        partial = blobs / f"{f.blob}.incomplete"
        needed += f.size - (partial.stat().st_size if f.blob and partial.exists() else 0)
    return max(needed, 0)


def check_room_for_download(repo_id: str, needed: int, cache_dir, margin_bytes: int) -> int:
    """Refuse a download that would not leave `margin_bytes` free in the hub cache; the free
    bytes where it fits."""
    cache = hub_cache_dir(cache_dir)
    free = free_bytes(cache)
    if free < needed + margin_bytes:
        raise EaglenestError(
            f"no room to download {repo_id}: it needs {human_bytes(needed)} ({needed:,} bytes) "
            f"not yet cached, plus the run's disk margin {human_bytes(margin_bytes)} "
            f"(hidden_states.disk_margin_gb), and {human_bytes(free)} ({free:,} bytes) are free "
            "here; nothing was fetched. Free space, or point target.cache_dir (or HF_HUB_CACHE) "
            "at a larger disk",
            cache,
        )
    return free


def download_stage(
    *,
    repo_id: str,
    revision: str | None,
    cache_dir=None,
    trust_remote_code: bool = False,
    allow_unpinned_remote_code: bool = False,
    disk_margin_gb: float = 0,
) -> Path:
    """The `download_target` rule: bring the snapshot into the hub cache. Online, the hub's
    file listing comes first: an unpinned remote-code target, or a snapshot the cache has no
    room for, is refused before a byte is fetched."""
    from huggingface_hub import constants

    if not constants.HF_HUB_OFFLINE:
        commit, files = hub_listing(repo_id, revision)
        if trust_remote_code:
            check_remote_code_pinned(repo_id, revision, commit, allow_unpinned=allow_unpinned_remote_code)
        needed = bytes_to_fetch(repo_id, files, cache_dir)
        free = check_room_for_download(repo_id, needed, cache_dir, int(disk_margin_gb * 1e9))
        logging.getLogger(__name__).info(
            "%s at commit %s: %s to fetch, %s free in %s",
            repo_id, commit, human_bytes(needed), human_bytes(free), hub_cache_dir(cache_dir),
        )  # fmt: skip
    return _download(repo_id, revision, cache_dir)


def _check_complete(folder: Path) -> list[tuple[str, int]]:
    """The snapshot's files; a missing config, weight file or weight shard is an error."""
    if not (folder / "config.json").exists():
        raise EaglenestError("target folder has no config.json", folder)
    files = sorted(
        (str(f.relative_to(folder)), f.stat().st_size)
        for f in folder.rglob("*")
        # The snapshot's own .cache (hub download state), not one the folder lives under (~/.cache).
        if f.is_file() and ".cache" not in f.relative_to(folder).parts
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
    name: str,
    *,
    revision: str | None = None,
    cache_dir=None,
    trust_remote_code: bool = False,
    allow_unpinned_remote_code: bool = False,
    built_here: bool = False,
) -> Target:
    """A local folder as it is, a hub id through the hub cache (downloading where allowed).
    A hub target's remote code is taken only from a pinned commit (unless allowed to follow a
    branch, or `built_here`: the workflow built it from the repository's own files) and only
    as the hub served it; its files are recorded with their hashes."""
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
    remote_code = []
    if trust_remote_code:
        if source == "hub" and not built_here:
            check_remote_code_pinned(name, revision, commit, allow_unpinned=allow_unpinned_remote_code)
        remote_code = remote_code_files(folder)
        if source == "hub":
            check_as_downloaded(folder, remote_code)
    return Target(
        name=name,
        path=str(folder),
        source=source,
        revision=revision,
        commit=commit,
        trust_remote_code=trust_remote_code,
        files=[list(f) for f in files],
        shape=asdict(read_shape(folder)),
        remote_code=remote_code,
    )


def resolve_stage(
    *,
    name: str,
    revision,
    cache_dir,
    trust_remote_code: bool,
    out_record,
    allow_unpinned_remote_code: bool = False,
    built_here: bool = False,
) -> dict:
    """The `resolve_target` rule: resolve and record."""

    target = resolve_target(
        name,
        revision=revision,
        cache_dir=cache_dir,
        trust_remote_code=trust_remote_code,
        allow_unpinned_remote_code=allow_unpinned_remote_code,
        built_here=built_here,
    )
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
    for f in target.remote_code:
        logging.getLogger(__name__).info(
            "remote code %s (%s): sha256 %s", f["file"], f["named_by"], f["sha256"]
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
    check_remote_code_unchanged(target, record_path)
    return target


# --------------------------------------------------------------------------------------------
# Remote code: only from a pinned commit, only as the hub served it

# The files whose `auto_map` names remote code: each entry maps a transformers Auto class to
# "module.Class" (a [slow, fast] pair for tokenizers), module.py being a file of the repository.
AUTO_MAP_FILES = (
    "config.json",
    "tokenizer_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)
# The workflow sets this to the config files it read, so a job's message can name them.
CONFIG_FILES_ENV = "EAGLENEST_CONFIG_FILES"
UNPINNED_KEY = "target.allow_unpinned_remote_code"


def is_pinned(revision: str | None) -> bool:
    """A revision that names one commit: a branch or tag can move to other files."""
    return bool(revision) and bool(COMMIT.match(revision))


def check_remote_code_pinned(
    repo_id: str, revision: str | None, commit: str | None, *, allow_unpinned: bool
) -> None:
    """Remote code from a branch is whatever the hub serves under that name the day a stage
    runs: refuse it, naming the commit to pin, unless the config chose to follow the branch."""
    if allow_unpinned or is_pinned(revision):
        return
    branch = f"the branch or tag {revision!r}" if revision else "the default branch (target.revision: null)"
    config = os.environ.get(CONFIG_FILES_ENV) or "the run's config"
    raise EaglenestError(
        f"{repo_id} runs remote code (target.trust_remote_code: true) from {branch}, which the "
        f"hub can point at other code at any time; none of it was imported. Pin the commit it "
        f"names now: set target.revision: {commit or '<the commit>'} in {config} (or "
        f"{UNPINNED_KEY}: true to follow the branch; docs/guide/target.md#remote-code-only-from-a-pinned-commit-only-as-the-hub-served-it)"
    )


def remote_code_files(folder) -> list[dict]:
    """The remote-code files transformers (and vLLM through it) would import from `folder`:
    each module an `auto_map` names and, recursively, the modules it imports relatively (the
    files transformers copies out with it), with their sha256."""
    from transformers.dynamic_module_utils import get_relative_import_files

    folder = Path(folder)
    named: dict[str, str] = {}
    for config_name in AUTO_MAP_FILES:
        for auto_class, module in _auto_map_modules(folder / config_name):
            named.setdefault(f"{module}.py", f"{config_name} auto_map.{auto_class}")
    found: dict[str, str] = {}
    for module_file, named_by in named.items():
        path = folder / module_file
        if not path.is_file():
            raise EaglenestError(f"{named_by} names {module_file}, which the model does not ship", folder)
        found.setdefault(module_file, named_by)
        for imported in get_relative_import_files(str(path)):
            rel = Path(imported).relative_to(folder).as_posix()
            found.setdefault(rel, f"imported by {module_file}")
    return [{"file": f, "named_by": why, **file_record(folder / f)} for f, why in sorted(found.items())]


def _auto_map_modules(path: Path) -> list[tuple[str, str]]:
    """(Auto class, module) for each code reference in one config file's `auto_map`."""
    if not path.is_file():
        return []
    config = read_json(path)
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    out = []
    for auto_class, refs in (auto_map or {}).items():
        for ref in refs if isinstance(refs, list) else [refs]:
            if not isinstance(ref, str) or not ref:
                continue
            if "--" in ref:  # "org/repo--module.Class": code another repository serves
                raise EaglenestError(
                    f"auto_map.{auto_class} names code in another repository ({ref}): target.revision "
                    "cannot pin it, so eaglenest does not run it. Copy that code into the model's folder",
                    path,
                )
            out.append((auto_class, ref.rsplit(".", 1)[0]))
    return out


def git_blob_sha1(path) -> str:
    """Git's id of a file's content: what the hub cache names a non-LFS file's blob by."""
    data = Path(path).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def check_as_downloaded(snapshot, remote_code: list[dict]) -> None:
    """A hub snapshot links each file to a blob named by the hub's hash of its content (sha256
    for LFS files, git's blob id for the others): a remote-code file edited in the cache no
    longer matches that name. Refused before anything imports it."""
    for f in remote_code:
        path = Path(snapshot) / f["file"]
        if not path.is_symlink():
            continue
        blob = Path(os.readlink(path)).name
        if blob not in (f["sha256"], git_blob_sha1(path)):
            raise EaglenestError(
                f"this remote-code file does not match the blob the hub served ({blob}): edited in "
                "the cache since it was downloaded? Nothing was imported. Delete the model's "
                "folder from the hub cache and download it again",
                path,
            )


def check_remote_code_unchanged(target: Target, record_path) -> None:
    """Every remote-code file is still what resolve_target recorded, before a stage imports it."""
    for f in target.remote_code:
        path = Path(target.path) / f["file"]
        now = file_record(path)["sha256"] if path.is_file() else "missing"
        if now != f["sha256"]:
            raise EaglenestError(
                f"remote code changed since resolve_target recorded it in {record_path} (sha256 "
                f"{f['sha256'][:12]}..., now {now[:12]}); nothing was imported. Restore the "
                "file (from a hub cache: delete the model's folder there and download it again)",
                path,
            )


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
