"""Reading and writing stage artifacts safely.

Every output is written under a temporary name in the same folder and renamed into place only
when complete, so a crash or a kill never leaves a file that looks finished.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from eaglenest.core.errors import EaglenestError


def _tmp_sibling(path: Path, is_dir: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{path.name}.tmp-"
    if is_dir:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=path.parent))
    fd, name = tempfile.mkstemp(prefix=prefix, dir=path.parent)
    os.close(fd)
    # mkstemp makes files private (0600); outputs are shared like any other file.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(name, 0o666 & ~umask)
    return Path(name)


@contextlib.contextmanager
def atomic_path(path, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it to `path` only if the block succeeds."""
    path = Path(path)
    tmp = _tmp_sibling(path, is_dir)
    try:
        yield tmp
        if is_dir and path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def save_tensor(tensor, path) -> None:
    """torch.save, to the same bytes every time: given a path, torch names the zip's inner
    folder after the file (here a random temporary name); given an open file, "archive"."""
    import torch

    with open(path, "wb") as f:
        torch.save(tensor, f)


def write_json(path, obj) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_jsonl(path, rows: Iterable[dict]) -> int:
    """Write rows as JSON lines atomically; return how many were written."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def read_json(path) -> dict:
    path = Path(path)
    if not path.exists():
        raise EaglenestError("file does not exist", path)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise EaglenestError(f"not valid JSON: {e}", path) from None


def iter_jsonl(path) -> Iterator[dict]:
    """Yield the objects of a JSON-lines file; a bad line raises with its line number."""
    path = Path(path)
    if not path.exists():
        raise EaglenestError("file does not exist", path)
    with open(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise EaglenestError(f"line {lineno}: malformed JSON ({e.msg})", path) from None
            if not isinstance(row, dict):
                raise EaglenestError(f"line {lineno}: expected a JSON object", path)
            yield row


def read_jsonl(path) -> list[dict]:
    return list(iter_jsonl(path))


# --------------------------------------------------------------------------------------------
# Full disks


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # a full disk, or a full quota on shared storage


class DiskFull(EaglenestError):
    """A stage ran out of disk: names the folder, the bytes it needs and the bytes free."""


def human_bytes(n) -> str:
    if n is None:
        return "unknown"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def free_bytes(folder) -> int:
    """Free bytes where `folder` is (or would be created)."""
    probe = Path(folder).resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def disk_full(folder, needed: int | None, what: str) -> DiskFull:
    return DiskFull(
        f"no space left for {what}: it needs about {human_bytes(needed)} here, "
        f"{human_bytes(free_bytes(folder))} are free. Nothing partial was kept: free space (or "
        "point run_dir elsewhere) and rerun, which resumes from the finished work",
        folder,
    )


@contextlib.contextmanager
def room_for(folder, needed: int | None, what: str) -> Iterator[None]:
    """Turn a full disk inside the block into a DiskFull naming `folder`. The block's own
    atomic writes have removed their temporary files by the time this runs."""
    try:
        yield
    except Exception as e:
        if is_disk_full(e):
            raise disk_full(folder, needed, what) from e
        raise


def is_disk_full(error: BaseException) -> bool:
    """A full disk or quota, as an OSError or as a library's own error that reports one
    (safetensors: "I/O error: No space left on device (os error 28)")."""
    if isinstance(error, OSError) and error.errno in NO_SPACE:
        return True
    return reports_disk_full(str(error))


def reports_disk_full(text: str) -> bool:
    """Whether a message (an error, a log's tail) says the disk or the quota is full."""
    return any(os.strerror(code) in text for code in NO_SPACE)


def installed_package_file(package: str, relpath, *, what: str) -> Path:
    """A data file shipped inside an installed Python package (a GGUF, a benchmark's
    questions), found without importing the package: none of its code runs."""
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise EaglenestError(
            f"{what}: no installed package {package!r} (envs/setup.sh installs the shipped "
            "configs' packages; pip install it for your own)"
        )
    path = Path(next(iter(found.submodule_search_locations))) / relpath
    if not path.is_file():
        raise EaglenestError(f"{what}: not in package {package}", path)
    return path


_HASH_CHUNK = 8 << 20


def bytes_record(data: bytes) -> dict:
    """`file_record` of a file whose bytes are in hand: no second read of what was just written."""
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def file_record(path) -> dict:
    """What the manifest keeps of one written file: its size and sha256."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return {"bytes": Path(path).stat().st_size, "sha256": h.hexdigest()}
