"""`eaglenest disk-usage RUN_DIR`: what a run folder holds, by stage folder, training spec and
sweep variant, each file counted once."""

import json
import os

from eaglenest import cli


def _file(path, size: int):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


def test_disk_usage_splits_training_specs_and_variants_and_counts_a_linked_file_once(tmp_path, capsys):
    run = tmp_path / "run"
    _file(run / "prompts" / "prompts.jsonl", 100)
    _file(run / "hidden_states" / "shard_0" / "hs_0.safetensors", 3000)
    _file(run / "hidden_states" / "shard_1" / "hs_1.safetensors", 3000)
    _file(run / ".eaglenest" / "train" / "spec-old" / "checkpoints" / "1" / "model.safetensors", 9000)
    kept = _file(run / ".eaglenest" / "hidden_states_kept" / "hs_0.safetensors", 700)
    current = run / ".eaglenest" / "train" / "spec-new"
    _file(current / "checkpoints" / "0" / "model.safetensors", 4000)
    (current / "data").mkdir()
    os.link(kept, current / "data" / "hs_0.safetensors")  # hybrid's hard link: one file on disk
    (current / "data" / "shard_0").symlink_to(run / "hidden_states" / "shard_0")
    _file(run / "variants" / "frac0.5" / "draft" / "model.safetensors", 1500)
    _file(run / "run_summary.csv", 10)

    assert cli.main(["disk-usage", str(run), "--json"]) == 0
    rows = {r["path"]: (r["bytes"], r["files"]) for r in json.loads(capsys.readouterr().out)}
    assert rows == {
        ".eaglenest/train/spec-old": (9000, 1),
        "hidden_states": (6000, 2),
        ".eaglenest/train/spec-new": (4000, 1),  # the hard link counted once, the symlink not followed
        "variants/frac0.5": (1500, 1),
        ".eaglenest/hidden_states_kept": (700, 1),
        "prompts": (100, 1),
        "run_summary.csv": (10, 1),
    }

    assert cli.main(["disk-usage", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{run}: {(9000 + 6000 + 4000 + 1500 + 700 + 100 + 10) / 1e3:.2f} kB in 8 files"
    assert lines[1].split()[:3] == [".eaglenest/train/spec-old", "9.00", "kB"]  # largest first


def test_disk_usage_of_a_missing_folder_names_it(tmp_path, capsys):
    assert cli.main(["disk-usage", str(tmp_path / "nope")]) == 1
    assert f"{tmp_path / 'nope'}: not a run folder" in capsys.readouterr().err
