"""Reading and writing stage artifacts safely.

Every output is written under a temporary name in the same folder and renamed into place only
when complete, so a crash or a kill never leaves a file that looks finished.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from eaglenest.errors import EaglenestError


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
