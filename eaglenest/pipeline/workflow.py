"""Glue shared by the Snakefile and the rule scripts: logging, code hashes, engine flags.

Kept free of heavy imports: the Snakefile imports this module on every `snakemake -n`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path

from eaglenest.pipeline.run_guard import Preempted, stop_on_sigterm

PACKAGE_DIR = Path(__file__).resolve().parents[1]


def setup_logging(log_path) -> logging.Logger:
    """Send the stage's logging (eaglenest and the engines) to the rule's `log:` file."""
    logging.basicConfig(
        filename=str(log_path),
        level=logging.INFO,
        force=True,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2", "openai", "urllib3"):
        # One line per request would bury the progress lines.
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger("eaglenest")


def run_logged(log_path, fn, *args, **kwargs):
    """Run a stage with logging to its log file; a failure's traceback goes there too. SIGTERM
    unwinds the stage cleanly (eaglenest.pipeline.run_guard)."""

    log = setup_logging(log_path)
    stop_on_sigterm()
    try:
        return fn(*args, **kwargs)
    except Preempted as stop:
        # Cleanup has run on the way here. Leave now: Python would otherwise wait at exit for
        # worker threads still in a request (up to its timeout), past a preemption's grace time.
        logging.shutdown()
        os._exit(stop.code)
    except Exception:
        log.exception("stage failed")
        raise


SCRIPTS_DIR = PACKAGE_DIR.parent / "scripts"


@functools.cache
def _source_tree(path: Path):
    """A file's syntax tree, parsed once per process (planning hashes every rule's closure).
    _behaviour strips its docstrings in place, which changes no import package_imports reads."""
    import ast

    return ast.parse(path.read_text(), filename=str(path))


def module_file(name: str) -> Path | None:
    """The source file of package module `name` ("training.train"), or None if there is none (a
    subpackage itself, a name that is not a module)."""
    path = PACKAGE_DIR / (name.replace(".", "/") + ".py")
    return path if path.is_file() else None


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


@functools.cache
def package_imports(path: Path) -> frozenset[str]:
    """The eaglenest modules a file imports ("training.train"), wherever the import statement is
    (some sit inside functions, to keep torch out of planning). A module an engine loads by its
    name (vLLM's KV connector) is no import: its rule names it in code_hash's `also`."""
    import ast

    found = set()
    for node in _statements(_source_tree(path)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".", 1)[1] for a in node.names if a.name.startswith("eaglenest.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module != "eaglenest" and not node.module.startswith("eaglenest."):
                continue
            package = node.module.partition(".")[2]
            for alias in node.names:
                # `from eaglenest.training import train` names a module; `from
                # eaglenest.training.train import main` names something inside one.
                submodule = f"{package}.{alias.name}" if package else alias.name
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


@functools.cache
def _behaviour(path: Path) -> str:
    """A file's code without its docstrings, comments and layout: what it does."""
    import ast

    def is_docstring(stmt) -> bool:
        return (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)
        )

    tree = _source_tree(path)
    for node in _statements(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and is_docstring(body[0]):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def code_hash(script: str, leave_out: tuple[str, ...] = (), also: tuple[str, ...] = ()) -> str:
    """Hash of what a rule's script runs: the script and every eaglenest module it reaches
    (stage_modules). A `params:` entry, so a change of behaviour there reruns the rule;
    Snakemake itself tracks the script's file only. Docstrings, comments and formatting are
    left out: editing them reruns nothing."""
    h = hashlib.sha256(_behaviour(SCRIPTS_DIR / f"{script}.py").encode())
    for name in stage_modules(script, leave_out, also):
        h.update(name.encode() + b"\0" + _behaviour(module_file(name)).encode())
    return h.hexdigest()[:16]


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def vllm_base_args(vcfg: dict, target_cfg: dict) -> tuple[str, ...]:
    """Flags every server of the run shares (the model itself is the spec's: the resolved
    target folder, a hub snapshot pinned to its commit, so no --revision)."""
    args = [
        "--dtype",
        vcfg["dtype"],
        "--max-model-len",
        str(vcfg["max_model_len"]),
        "--tensor-parallel-size",
        str(vcfg.get("tensor_parallel_size", 1)),
    ]
    if vcfg.get("enforce_eager"):
        args.append("--enforce-eager")
    if target_cfg.get("trust_remote_code"):
        args.append("--trust-remote-code")
    return (*args, *vcfg.get("extra_args", []))


def vllm_env(vcfg: dict) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in (vcfg.get("env") or {}).items()))


def with_reasoning_parser(args: tuple[str, ...], parser: str | None) -> tuple[str, ...]:
    return (*args, "--reasoning-parser", parser) if parser else args
