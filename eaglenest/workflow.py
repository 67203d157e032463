"""Glue shared by the Snakefile and the rule scripts: logging, code hashes, engine flags.

Kept free of heavy imports: the Snakefile imports this module on every `snakemake -n`.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

from eaglenest.errors import EaglenestError

PACKAGE_DIR = Path(__file__).resolve().parent
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def setup_logging(log_path) -> logging.Logger:
    """Send the stage's logging (eaglenest and the engines) to the rule's `log:` file."""
    logging.basicConfig(filename=str(log_path), level=logging.INFO, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "openai", "urllib3"):
        # One line per request would bury the progress lines.
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger("eaglenest")


def run_logged(log_path, fn, *args, **kwargs):
    """Run a stage with logging to its log file; a failure's traceback goes there too."""
    log = setup_logging(log_path)
    try:
        return fn(*args, **kwargs)
    except Exception:
        log.exception("stage failed")
        raise


def code_hash(*modules: str) -> str:
    """Content hash of the package modules a rule runs: edits rerun it, touches do not.

    Snakemake tracks a `script:` file's mtime but not the modules it imports, so each rule
    carries this as a `params:` entry.
    """
    h = hashlib.sha256()
    for name in sorted(modules):
        h.update((PACKAGE_DIR / f"{name}.py").read_bytes())
    return h.hexdigest()[:16]


def check_target(path: str, built_here: bool) -> None:
    """A target is a folder (existing or built by the workflow) or a Hugging Face id."""
    if built_here or Path(path).exists():
        return
    if path.startswith((".", "/", "~")) or not HUB_ID.match(path):
        raise EaglenestError("target path does not exist (and is not a Hugging Face id "
                             "'org/name')", path)


def target_config_path(path: str, revision: str | None = None) -> Path:
    """The target's config.json: in its folder, or fetched (config only) from the hub."""
    local = Path(path) / "config.json"
    if local.exists():
        return local
    if Path(path).exists():
        raise EaglenestError("target folder has no config.json", path)
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(path, "config.json", revision=revision))


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def vllm_base_args(vcfg: dict, target_cfg: dict) -> tuple[str, ...]:
    """Flags every server of the run shares (the model itself is the spec's)."""
    args = ["--dtype", vcfg["dtype"], "--max-model-len", str(vcfg["max_model_len"]),
            "--tensor-parallel-size", str(vcfg.get("tensor_parallel_size", 1))]
    if vcfg.get("enforce_eager"):
        args.append("--enforce-eager")
    if target_cfg.get("trust_remote_code"):
        args.append("--trust-remote-code")
    if target_cfg.get("revision"):
        args += ["--revision", target_cfg["revision"]]
    return (*args, *vcfg.get("extra_args", []))


def vllm_env(vcfg: dict) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in (vcfg.get("env") or {}).items()))


def with_reasoning_parser(args: tuple[str, ...], parser: str | None) -> tuple[str, ...]:
    return (*args, "--reasoning-parser", parser) if parser else args

