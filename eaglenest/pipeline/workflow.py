"""Glue shared by the Snakefile and the rule scripts: logging, engine flags.

Kept free of heavy imports: the Snakefile imports this module on every `snakemake -n`.
"""

from __future__ import annotations

import logging
import os

from eaglenest.pipeline.run_guard import Preempted, stop_on_sigterm


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


def with_parsers(args: tuple[str, ...], reasoning_parser: str | None, tool_call_parser: str | None = None):
    """The server's arguments with vLLM's reasoning and tool-call parsers, where configured (a
    tool parser answers `tool_choice: auto`, so it comes with --enable-auto-tool-choice)."""
    if reasoning_parser:
        args = (*args, "--reasoning-parser", reasoning_parser)
    if tool_call_parser:
        args = (*args, "--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser)
    return args
