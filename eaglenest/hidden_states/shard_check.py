"""Is every hidden-state file of a shard still what extraction wrote?

A shard's manifest records each file's size and sha256 when the shard completes. Later a partial
copy to shared storage or a failing disk can truncate or corrupt a file while Snakemake still
takes the shard as complete; speculators' loader would then die hours into training. So:

- training checks every file's size against the manifest and parses its safetensors header
  (the header must hold `hidden_states` and `token_ids`, and its data must end exactly at the
  end of the file) before anything trains: cheap, no data read;
- `eaglenest verify-shards DIR... --checksums` also re-hashes every file (reads all of it).

A problem names the file and the shard and gives the command that rebuilds that shard alone.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import file_record

REQUIRED_TENSORS = ("hidden_states", "token_ids")


def header_problem(path: Path, required=REQUIRED_TENSORS) -> str | None:
    """What is wrong with a safetensors file's header and extent, or None. `required`: tensors
    it must hold (a hidden-state file's by default)."""
    size = path.stat().st_size
    if size < 8:
        return f"{size} bytes: too short for a safetensors header"
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if 8 + n > size:
            return f"header of {n} bytes does not fit in the file's {size} bytes (truncated)"
        try:
            header = json.loads(f.read(n))
        except ValueError:
            return "header is not valid JSON (corrupted)"
    if not isinstance(header, dict):
        return "header is not a JSON object (corrupted)"
    missing = [t for t in required if t not in header]
    if missing:
        return f"no tensor {', '.join(missing)} in the header"
    try:
        end = max(int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__")
    except (KeyError, TypeError, ValueError, IndexError):
        return "tensor entries without data offsets (corrupted)"
    if 8 + n + end != size:
        return f"data should end at byte {8 + n + end} but the file has {size} bytes (truncated or grown)"
    return None


@dataclass
class ShardProblem:
    shard: Path
    file: Path
    problem: str


def check_shard(shard_dir, checksums: bool = False) -> list[ShardProblem]:
    """Every problem of one shard: missing manifest or files, sizes, headers, checksums."""
    shard = Path(shard_dir)
    manifest_path = shard / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as e:
        return [ShardProblem(shard, manifest_path, f"unreadable manifest ({e.__class__.__name__})")]
    files = manifest.get("files")
    if files is None:  # written before manifests listed files: the headers are all we can check
        files = {p.name: {} for p in sorted(shard.glob("hs_*.safetensors"))}
    problems = []
    for name, rec in files.items():
        path = shard / name
        if not path.exists():
            problems.append(ShardProblem(shard, path, "missing"))
            continue
        size = path.stat().st_size
        if "bytes" in rec and size != rec["bytes"]:
            problems.append(ShardProblem(shard, path, f"{size} bytes, the manifest says {rec['bytes']}"))
            continue
        problem = header_problem(path)
        if problem is None and checksums and "sha256" in rec and file_record(path)["sha256"] != rec["sha256"]:
            problem = "sha256 differs from the manifest's (corrupted)"
        if problem:
            problems.append(ShardProblem(shard, path, problem))
    return problems


def rebuild_command(shard: Path) -> str:
    return f"snakemake --cores all --force {shard}"


def verify_shards(shard_dirs, checksums: bool = False, forget=None) -> dict:
    """Check every shard; raise one error listing each bad file with its shard's rebuild
    command, after handing the bad files to `forget` (the sample store's: it links the same
    files, and a rebuild must not take them back from it). Returns the counts checked."""
    shard_dirs = [Path(s) for s in shard_dirs]
    problems = [p for s in shard_dirs for p in check_shard(s, checksums)]
    if problems:
        if forget is not None:
            forget(p.file for p in problems)
        lines = [f"{p.file} (shard {p.shard.name}): {p.problem}" for p in problems[:20]]
        if len(problems) > 20:
            lines.append(f"... and {len(problems) - 20} more")
        bad = sorted({p.shard for p in problems})
        lines.append("Rebuild each bad shard alone (nothing else reruns before training):")
        lines += [f"  {rebuild_command(s)}" for s in bad]
        raise EaglenestError(
            f"{len(problems)} hidden-state file(s) in {len(bad)} shard(s) are not what extraction "
            "wrote; nothing was trained on them:\n" + "\n".join(lines)
        )
    files = sum(len(list(Path(s).glob("hs_*.safetensors"))) for s in shard_dirs)
    return {"shards": len(shard_dirs), "files": files, "checksums": checksums}


__all__ = ["check_shard", "header_problem", "rebuild_command", "verify_shards"]
