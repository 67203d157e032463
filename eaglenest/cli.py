"""The `eaglenest` command: each workflow stage usable on its own, outside Snakemake.

Subcommands register themselves in `SUBCOMMANDS` (one small function each that adds its parser
and points `run` at the code), so stages can be added without touching `main`. Heavy imports
(torch) happen inside the `run` functions, so `eaglenest --help` stays instant.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.hidden_states.shard_check import verify_shards
from eaglenest.hidden_states.store import forget as forget_stored_samples
from eaglenest.planning.plan import format_plan, make_plan
from eaglenest.report.disk_usage import folder_usage, format_usage

Register = Callable[["argparse._SubParsersAction"], None]
SUBCOMMANDS: list[Register] = []


def subcommand(register: Register) -> Register:
    """Add a subcommand's parser-building function to the registry."""
    SUBCOMMANDS.append(register)
    return register


# --------------------------------------------------------------------------------------------
# vocab-mapping


@subcommand
def _vocab_mapping(subparsers) -> None:
    p = subparsers.add_parser(
        "vocab-mapping",
        help="choose the draft vocabulary from token counts (t2d/d2t + coverage report)",
        description=(
            "Select the DRAFT_VOCAB_SIZE most frequent target ids (ties to the lower id, unseen "
            "ids fill in lowest first, always-kept ids first) and write t2d.pt, d2t.pt, "
            "t2d.npy, d2t.npy and vocab_coverage.json to OUTPUT_DIR."
        ),
    )
    p.add_argument(
        "--token-freq",
        required=True,
        metavar="FILE",
        help="token_freq.pt: dense count tensor [target_vocab] or {token_id: count}",
    )
    p.add_argument("--draft-vocab-size", required=True, type=int, metavar="N")
    p.add_argument("--output-dir", required=True, metavar="DIR")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--target-model", metavar="PATH", help="target model folder; vocab_size is read from its config.json"
    )
    target.add_argument("--target-vocab-size", type=int, metavar="V")
    p.add_argument(
        "--always-keep-ids",
        type=int,
        nargs="+",
        default=[],
        metavar="ID",
        help="ids that are always in the draft vocabulary (e.g. special tokens)",
    )
    p.add_argument("--plot", metavar="FILE", help="also write a PNG of coverage vs draft size")
    p.set_defaults(run=_run_vocab_mapping)


def _run_vocab_mapping(args: argparse.Namespace) -> int:
    # Lazy: vocab imports torch, which `eaglenest plan` and `--help` do not need.
    from eaglenest.data.vocab import MappingPaths, build_vocab_mapping

    paths = MappingPaths.in_dir(args.output_dir, coverage_plot=args.plot)
    cov = build_vocab_mapping(
        args.token_freq,
        args.draft_vocab_size,
        paths,
        target_config=args.target_model,
        target_vocab_size=args.target_vocab_size,
        always_keep_ids=args.always_keep_ids,
    )
    print(
        f"{cov['draft_vocab_size']} of {cov['target_vocab_size']} ids cover "
        f"{cov['coverage']:.2%} of {cov['total_masked_tokens']} masked tokens -> "
        f"{args.output_dir}"
    )
    return 0


# --------------------------------------------------------------------------------------------
# plan


@subcommand
def _plan(subparsers) -> None:
    p = subparsers.add_parser(
        "plan",
        help="before a run: the stages that will run and why, hidden-state bytes, GPU order",
        description=(
            "Dry-run the workflow (snakemake -n, offline) and print the stages that will run "
            "and why (missing output, stale input, changed params or code, upstream rerun), "
            "the hidden-state storage (measured from the tokenized data, or estimated from the "
            "config), and the GPU rules in the order they will run. Arguments after `--` go "
            "to snakemake unchanged (targets, --forcerun RULE, ...)."
        ),
    )
    p.add_argument("-s", "--snakefile", metavar="FILE")
    p.add_argument("-d", "--directory", metavar="DIR", help="snakemake's working directory")
    p.add_argument("--configfile", "--configfiles", nargs="+", action="extend", default=[], metavar="FILE")
    p.add_argument("--config", "-C", nargs="+", action="extend", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER, metavar="-- SNAKEMAKE_ARGS")
    p.set_defaults(run=_run_plan)


def _run_plan(args: argparse.Namespace) -> int:
    extra = list(args.snakemake_args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    plan = make_plan(
        snakefile=args.snakefile,
        directory=args.directory,
        configfiles=args.configfile,
        config_entries=args.config,
        extra_args=extra,
    )
    if args.json:
        print(json.dumps(plan, indent=1, default=str))
    else:
        print(format_plan(plan))
    return 0


# --------------------------------------------------------------------------------------------
# verify-shards


@subcommand
def _verify_shards(subparsers) -> None:
    p = subparsers.add_parser(
        "verify-shards",
        help="check hidden-state shards against their manifests (sizes, headers, checksums)",
        description=(
            "Check each shard folder (or every shard_* under a hidden_states folder): every file "
            "the manifest lists is there with its recorded size and a whole safetensors header; "
            "with --checksums, its sha256 as well (reads every byte). Bad files are listed with "
            "the command that rebuilds their shard alone."
        ),
    )
    p.add_argument("dirs", nargs="+", metavar="DIR", help="shard folders, or folders holding shard_* folders")
    p.add_argument("--checksums", action="store_true", help="also compare each file's sha256")
    p.set_defaults(run=_run_verify_shards)


def _run_verify_shards(args: argparse.Namespace) -> int:
    shards = []
    for d in map(Path, args.dirs):
        inner = sorted(d.glob("shard_*"), key=lambda p: (len(p.name), p.name))
        shards += inner if inner and not (d / "manifest.json").exists() else [d]
    result = verify_shards(shards, checksums=args.checksums, forget=forget_stored_samples)
    print(
        f"ok: {result['files']} files in {result['shards']} shards"
        + (", checksums match" if args.checksums else "")
    )
    return 0


# --------------------------------------------------------------------------------------------
# disk-usage


@subcommand
def _disk_usage(subparsers) -> None:
    p = subparsers.add_parser(
        "disk-usage",
        help="how much a run folder holds, by stage folder, training spec and variant",
        description=(
            "Sum the bytes under each of RUN_DIR's folders (each stage's outputs; each training "
            "spec's checkpoints under .eaglenest/train/; each sweep variant), largest first. A "
            "file linked from two places counts once."
        ),
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(run=_run_disk_usage)


def _run_disk_usage(args: argparse.Namespace) -> int:
    rows = folder_usage(args.run_dir)
    print(json.dumps(rows, indent=2) if args.json else format_usage(rows, args.run_dir))
    return 0


# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eaglenest", description="Train EAGLE-3 draft heads: workflow stages as commands."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in SUBCOMMANDS:
        register(subparsers)
    return parser


def main(argv=None) -> int:
    """Run one subcommand; bad input prints `eaglenest: error: FILE: PROBLEM` and returns 1."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args)
    except EaglenestError as e:
        print(f"eaglenest {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
