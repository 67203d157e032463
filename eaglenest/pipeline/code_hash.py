"""Rule code hashes: what each rule's script runs, derived from its imports (planning only).

Its own module, apart from the glue the scripts import (eaglenest.pipeline.workflow): no stage
runs this code, so editing how hashes are computed reruns nothing.
"""

from __future__ import annotations

import ast
import atexit
import functools
import hashlib
import json
import os
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]
SCRIPTS_DIR = PACKAGE_DIR.parent / "scripts"


def _statements(tree):
    """Every statement of a tree, nested ones included (imports and docstrings are statements):
    ast.walk's visit of every expression made planning's code hashes several times slower."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                todo.extend(block)


def _read_source_facts(source: str, path: Path) -> dict:
    """What planning needs of a file: the eaglenest names it imports, as (package, name) pairs
    (name None for `import eaglenest.x`), and its code without docstrings, comments and layout."""

    def is_docstring(stmt) -> bool:
        return (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)
        )

    tree = ast.parse(source, filename=str(path))
    imported = []
    for node in _statements(tree):
        if isinstance(node, ast.Import):
            imported += [
                [a.name.split(".", 1)[1], None] for a in node.names if a.name.startswith("eaglenest.")
            ]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module == "eaglenest" or (node.module or "").startswith("eaglenest."))
        ):
            imported += [[node.module.partition(".")[2], a.name] for a in node.names]
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and is_docstring(body[0]):
            node.body = body[1:] or [ast.Pass()]
    return {"imports": imported, "behaviour": ast.dump(tree)}


# Parsing and dumping the package's files is most of planning's own cost (0.4 s of every
# `snakemake` call): each file's facts are kept by the sha256 of its bytes, beside Python's own
# bytecode cache, so only an edited file is parsed again. A cache that cannot be read or written
# is only slower.
FACTS_CACHE = PACKAGE_DIR / "__pycache__" / f"code-facts.{sys.implementation.cache_tag}.json"


@functools.cache
def _facts_cache() -> dict:
    try:
        cache = json.loads(FACTS_CACHE.read_text())
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def _save_facts_cache() -> None:
    tmp = FACTS_CACHE.with_name(f"{FACTS_CACHE.name}.{os.getpid()}.tmp")
    try:
        FACTS_CACHE.parent.mkdir(exist_ok=True)
        # Files gone since (a test's temporary module, a renamed one) leave with this save.
        kept = {path: facts for path, facts in _facts_cache().items() if Path(path).is_file()}
        tmp.write_text(json.dumps(kept))
        os.replace(tmp, FACTS_CACHE)  # whole or not at all, with other processes planning too
    except OSError:
        tmp.unlink(missing_ok=True)


@functools.cache
def _save_at_exit() -> None:
    atexit.register(_save_facts_cache)  # once per process, after every miss is in


@functools.cache
def _source_facts(path: Path) -> dict:
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    cache = _facts_cache()
    cached = cache.get(str(path))
    if (
        isinstance(cached, dict)
        and cached.get("sha256") == digest
        and {"imports", "behaviour"} <= cached.keys()
    ):
        return cached
    facts = {"sha256": digest, **_read_source_facts(data.decode(), path)}
    _save_at_exit()
    cache[str(path)] = facts
    return facts


def module_file(name: str) -> Path | None:
    """The source file of package module `name` ("training.train"), or None if there is none (a
    subpackage itself, a name that is not a module)."""
    path = PACKAGE_DIR / (name.replace(".", "/") + ".py")
    return path if path.is_file() else None


@functools.cache
def package_imports(path: Path) -> frozenset[str]:
    """The eaglenest modules a file imports ("training.train"), wherever the import statement is
    (some sit inside functions, to keep torch out of planning). A module an engine loads by its
    name (vLLM's KV connector) is no import: its rule names it in code_hash's `also`."""
    found = set()
    for package, name in _source_facts(path)["imports"]:
        if name is None:  # `import eaglenest.training.train`
            found.add(package)
            continue
        # `from eaglenest.training import train` names a module; `from
        # eaglenest.training.train import main` names something inside one.
        submodule = f"{package}.{name}" if package else name
        found.add(submodule if module_file(submodule) else package)
    return frozenset(m for m in found if module_file(m))


def stage_modules(script: str, leave_out: tuple[str, ...] = (), also: tuple[str, ...] = ()) -> list[str]:
    """Every eaglenest module a rule's script can run: its imports, theirs, and so on, and the
    modules in `also` (loaded by name) with theirs. `leave_out` cuts a branch the config does
    not take (the Kimi builder for the tiny Llama)."""
    seen: set[str] = set()
    todo = set(package_imports(SCRIPTS_DIR / f"{script}.py")) | set(also)
    while todo:
        name = todo.pop()
        if name in seen or name in leave_out:
            continue
        seen.add(name)
        path = module_file(name)
        if path is None:
            raise ValueError(f"code_hash({script!r}): no module eaglenest.{name}")
        todo |= package_imports(path)
    return sorted(seen)


def _behaviour(path: Path) -> str:
    """A file's code without its docstrings, comments and layout: what it does."""
    return _source_facts(path)["behaviour"]


def code_hash(script: str, leave_out: tuple[str, ...] = (), also: tuple[str, ...] = ()) -> str:
    """Hash of what a rule's script runs: the script and every eaglenest module it reaches
    (stage_modules). A `params:` entry, so a change of behaviour there reruns the rule;
    Snakemake itself tracks the script's file only. Docstrings, comments and formatting are
    left out: editing them reruns nothing."""
    h = hashlib.sha256(_behaviour(SCRIPTS_DIR / f"{script}.py").encode())
    for name in stage_modules(script, leave_out, also):
        h.update(name.encode() + b"\0" + _behaviour(module_file(name)).encode())
    return h.hexdigest()[:16]
