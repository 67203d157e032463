"""Extracted samples kept for reuse: growing the data extracts only the new rows.

A shard is a row range of `tokenized_data.jsonl` (its files named by global row index), so adding
prompts moves every shard's bounds and reruns every extraction job. What a sample's file holds,
though, is decided by the row's token ids and by the extraction's settings alone: the target's
files, the stored layers, the stored dtype, and the engine that computes them (backend, package
versions, serving flags, device). So every sample a shard writes is also linked into a store under
the run folder, keyed by both:

    <run>/.eaglenest/hidden_state_store/<settings key>/settings.json   what the key stands for
    <run>/.eaglenest/hidden_state_store/<settings key>/<ab>/<token key>/
        hs.safetensors   a hard link to the shard's file: no second copy on disk
        record.json      its size and sha256 (the manifest's record), token count and fp8 error

(`token key`: the sha256 of the row's token ids, `ab` its first two digits). An extraction links
each row the store holds into its shard (a copy where the shard is on another filesystem) and asks
the engine only for the others, so the shard holds the bytes a fresh run writes and the manifest
their records. Where the store cannot be filled by a link (another filesystem), nothing is kept:
no sample is ever stored twice.

Other settings are another key, so a stale entry is never read. Training removes every entry no
shard holds any more (its link count is 1): samples of rows taken out of the data, or extracted
under other settings (`prune`). A shard file the shard check finds damaged is dropped from the
store too (`forget`: its link is the same bytes), so rebuilding the shard extracts it again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from importlib import metadata
from pathlib import Path

from eaglenest.core.io import atomic_path, is_disk_full, write_json
from eaglenest.hidden_states.shard_check import header_problem
from eaglenest.pipeline.workflow import resolve_device
from eaglenest.planning.run_estimate import FP8

log = logging.getLogger(__name__)

# Bump when eaglenest changes the bytes it stores for a sample (extract.stored_tensors, the fp8
# quantizer, the CPU connector's file): every earlier entry then belongs to another key.
STORE_FORMAT = 1
SAMPLE_FILE, RECORD_FILE, SETTINGS_FILE = "hs.safetensors", "record.json", "settings.json"
STORE_DIR = ".eaglenest/hidden_state_store"  # in the run folder


def store_root(run_dir) -> Path:
    return Path(run_dir).resolve() / STORE_DIR


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def target_identity(folder) -> list:
    """The target's files as extraction reads them: every file's name, size and modification
    time (a rewritten or replaced file is another target; weights are never hashed: a hub
    snapshot's files are links to blobs named by their content). Caches are no files of it."""
    folder, files = Path(folder), []
    for f in folder.rglob("*"):
        name = f.relative_to(folder)
        if f.is_file() and not {".cache", "__pycache__"} & set(name.parts):
            st = f.stat()
            files.append([str(name), st.st_size, st.st_mtime_ns])
    return sorted(files)


def engine_identity(backend: str, server_cfg: dict) -> dict:
    """What of the engine decides a sample's values: the backend and its packages' versions;
    for vLLM also every serving flag and variable and the device it runs on."""
    packages = ("vllm" if backend == "vllm" else "transformers", "torch", "safetensors")
    engine = {"backend": backend, "versions": {p: _version(p) for p in packages}}
    if backend == "vllm":
        engine.update(
            args=list(server_cfg["base_args"]),
            env=sorted([k, str(v)] for k, v in server_cfg["env"].items()),
            device=resolve_device(server_cfg["device"]),
        )
    return engine


def extraction_settings(
    *, target, aux_layer_ids, num_layers: int, dtype: str, backend: str, server_cfg: dict
) -> dict:
    """Everything that decides a sample's file besides its token ids: the store's key."""
    settings = {
        "format": STORE_FORMAT,
        "target": target_identity(target),
        "layers": [*aux_layer_ids, num_layers],
        "dtype": dtype,
        "engine": engine_identity(backend, server_cfg),
    }
    if dtype == FP8:  # hs_connectors' fp8 file format
        settings["engine"]["versions"]["hs_connectors"] = _version("hs_connectors")
    return settings


def settings_key(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def token_key(input_ids) -> str:
    return hashlib.sha256(json.dumps(list(input_ids), separators=(",", ":")).encode()).hexdigest()


class _NoLinks(Exception):
    """The store cannot hold a hard link to this shard's files."""


def link_or_copy(src, dest) -> None:
    """A hard link of `src` at `dest`, or a copy where links fail (another filesystem)."""
    try:
        os.link(src, dest)
    except OSError as e:
        if is_disk_full(e):
            raise
        shutil.copyfile(src, dest)


class SampleStore:
    """The samples extracted under one set of settings (`extraction_settings`), by token ids."""

    def __init__(self, run_dir, settings: dict):
        self.settings = settings
        self.key = settings_key(settings)
        self.folder = store_root(run_dir) / self.key
        self.linkable = True

    def _entry(self, input_ids) -> Path:
        key = token_key(input_ids)
        return self.folder / key[:2] / key

    def record(self, input_ids) -> dict | None:
        """The record of the sample the store holds for these token ids, or None. An entry that
        is not whole (its file cut short, its header broken) is removed: it is extracted again."""
        entry = self._entry(input_ids)
        try:
            record = json.loads((entry / RECORD_FILE).read_text())
            size = (entry / SAMPLE_FILE).stat().st_size
        except (OSError, ValueError):
            return None
        whole = size == record.get("bytes") and record.get("tokens") == len(input_ids)
        if whole and header_problem(entry / SAMPLE_FILE) is None:
            return record
        log.warning("sample store: dropping a damaged entry %s", entry)
        shutil.rmtree(entry, ignore_errors=True)
        return None

    def lookup(self, rows) -> dict[int, dict]:
        """{row index: record} of the rows [(index, row)] whose samples the store holds."""
        if not self.folder.is_dir():
            return {}
        found = {}
        for i, row in rows:
            if (record := self.record(row["input_ids"])) is not None:
                found[i] = record
        return found

    def link(self, input_ids, dest) -> None:
        """The stored sample of these token ids at `dest`: linked, or copied across filesystems."""
        link_or_copy(self._entry(input_ids) / SAMPLE_FILE, dest)

    def keep(self, input_ids, path, record: dict) -> None:
        """Keep the sample written at `path` (with its record) for these token ids, as a hard
        link; an entry already there (the same tokens twice) stays. Where the store cannot
        link to `path` (another filesystem), it keeps nothing, and says so once."""
        entry = self._entry(input_ids)
        if not self.linkable or entry.exists():
            return
        settings = self.folder / SETTINGS_FILE
        if not settings.exists():
            write_json(settings, self.settings)
        entry.parent.mkdir(parents=True, exist_ok=True)
        try:
            with atomic_path(entry, is_dir=True) as tmp:
                try:
                    os.link(path, tmp / SAMPLE_FILE)
                except OSError as e:
                    if is_disk_full(e):
                        raise
                    raise _NoLinks(str(e)) from e
                (tmp / RECORD_FILE).write_text(json.dumps(record) + "\n")
        except _NoLinks as e:
            self.linkable = False
            log.warning(
                "sample store: cannot link %s into %s (%s): samples are not kept for reuse", path, entry, e
            )


def forget(files) -> int:
    """Drop the stored samples that are these files (the same inode: a shard's file the shard
    check found damaged, whose store link is damaged alike), so rebuilding the shard extracts them
    again; return how many. The store is the one of the run folder that holds each file's shard
    (`<run>/hidden_states/shard_k/hs_i.safetensors`)."""
    bad, roots = set(), set()
    for f in map(Path, files):
        with contextlib.suppress(OSError):
            st = f.stat()
            bad.add((st.st_dev, st.st_ino))
            roots.add(store_root(f.parent.parent.parent))
    dropped = 0
    for root in roots:
        for entry in (e for key in _folders(root) for fan in _folders(key) for e in _folders(fan)):
            with contextlib.suppress(OSError):
                st = (entry / SAMPLE_FILE).stat()
                if (st.st_dev, st.st_ino) in bad:
                    shutil.rmtree(entry)
                    dropped += 1
    return dropped


def prune(run_dir) -> dict:
    """Remove every stored sample no shard holds (its link count is 1), whatever its settings,
    with what killed writers left; return the counts. Only while no extraction runs: training,
    once every shard is complete (or, online and hybrid, none is made)."""
    counts = {"kept": 0, "removed": 0, "bytes_freed": 0}
    for key_dir in _folders(store_root(run_dir)):
        for fan in _folders(key_dir):
            for entry in _folders(fan):
                try:
                    st = None if entry.name.startswith(".") else (entry / SAMPLE_FILE).stat()
                except OSError:
                    st = None
                if st is None:  # a killed writer's temporary folder, or an entry without its file
                    shutil.rmtree(entry, ignore_errors=True)
                    continue
                if st.st_nlink > 1:
                    counts["kept"] += 1
                    continue
                shutil.rmtree(entry, ignore_errors=True)
                counts["removed"] += 1
                counts["bytes_freed"] += st.st_size
            with contextlib.suppress(OSError):
                fan.rmdir()  # when empty
        if not _folders(key_dir):
            shutil.rmtree(key_dir, ignore_errors=True)  # its settings.json alone
    return counts


def _folders(path: Path) -> list[Path]:
    """The folders in `path`, sorted; none where it is gone (a sweep's other trainer pruned it)."""
    try:
        return sorted(p for p in path.iterdir() if p.is_dir())
    except FileNotFoundError:
        return []


__all__ = [
    "STORE_DIR",
    "SampleStore",
    "extraction_settings",
    "forget",
    "link_or_copy",
    "prune",
    "settings_key",
    "token_key",
]
