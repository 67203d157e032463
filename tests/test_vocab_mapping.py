"""The draft vocabulary mapping: selection rules, file contract, errors, CLI, speculators parity.

speculators' own functions are the reference. Importing the `speculators` package costs ~7 s
(it pulls in its models, transformers and datasets), so the fast tests compile the two
functions they need (`build_vocab_mappings_from_distribution`, the trainer's `_load_mappings`)
straight from the installed source files. `test_extracted_reference_is_speculators_own`
imports the real package to prove that is the same code; it runs with `-m engine`.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import os
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from eaglenest import cli
from eaglenest.core.errors import EaglenestError
from eaglenest.data.vocab import (
    MappingPaths,
    build_vocab_mapping,
    compute_vocab_mapping,
    coverage_sizes,
    load_token_counts,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
OUTPUT_NAMES = ("t2d.pt", "d2t.pt", "t2d.npy", "d2t.npy", "vocab_coverage.json")
_SPECULATORS_SOURCES = {
    "build_vocab_mappings_from_distribution": "train/vocab_mapping.py",
    "_load_mappings": "train/cli.py",
}


def _speculators_source(name: str) -> tuple[str, str]:
    """(source text, file) of a top-level speculators function, without importing the package."""
    spec = importlib.util.find_spec("speculators")  # locating a top-level package runs nothing
    path = Path(spec.submodule_search_locations[0]) / _SPECULATORS_SOURCES[name]
    text = path.read_text()
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(text, node), str(path)


def _speculators_function(name: str):
    source, path = _speculators_source(name)
    namespace = {"torch": torch, "np": np, "logger": logging.getLogger("speculators")}
    exec(compile(source, path, "exec"), namespace)
    return namespace[name]


spec_build = _speculators_function("build_vocab_mappings_from_distribution")
spec_load_mappings = _speculators_function("_load_mappings")


# --------------------------------------------------------------------------------------------
# helpers


def selected(counts, n, keep=()):
    m = compute_vocab_mapping(torch.as_tensor(counts, dtype=torch.int64), n, keep)
    return m.selected_ids.tolist()


def save(path: Path, obj) -> Path:
    torch.save(obj, path)
    return path


def write_config(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def run_build(tmp_path, freq, n, **kw):
    out = tmp_path / "out"
    cov = build_vocab_mapping(freq, n, MappingPaths.in_dir(out), **kw)
    return out, cov


def load_outputs(out: Path):
    t2d = torch.load(out / "t2d.pt", weights_only=True)
    d2t = torch.load(out / "d2t.pt", weights_only=True)
    return t2d, d2t, np.load(out / "t2d.npy"), np.load(out / "d2t.npy")


def zipf_counts(vocab: int, tokens: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1) ** 1.1
    counts = rng.multinomial(tokens, p / p.sum())[rng.permutation(vocab)]
    return torch.from_numpy(counts.astype(np.int64))


# --------------------------------------------------------------------------------------------
# selection rules


def test_ties_go_to_lower_id():
    assert selected([3, 5, 3, 5, 3, 1], 3) == [0, 1, 3]
    assert selected([2, 2, 2, 2], 2) == [0, 1]
    assert selected([0, 7, 7, 7, 9], 3) == [1, 2, 4]


def test_fewer_seen_ids_than_slots_fill_lowest_unused():
    # seen: 5 and 9; the three remaining slots go to 0, 1, 2
    assert selected([0, 0, 0, 0, 0, 4, 0, 0, 0, 1], 5) == [0, 1, 2, 5, 9]
    # an id that is seen is never duplicated by the fill
    assert selected([0, 3, 0, 0], 3) == [0, 1, 2]


def test_always_kept_ids_take_slots_first():
    counts = [10, 9, 8, 7, 0, 0, 1]
    assert selected(counts, 3) == [0, 1, 2]
    assert selected(counts, 3, keep=[5]) == [0, 1, 5]  # unseen, kept anyway
    assert selected(counts, 3, keep=[6, 5]) == [0, 5, 6]
    assert selected(counts, 3, keep=[0, 0, 5]) == [0, 1, 5]  # duplicates count once
    assert selected(counts, 3, keep=[4, 5, 6]) == [4, 5, 6]  # exactly full


def test_offsets_identity_and_dtypes(tmp_path):
    counts = zipf_counts(5000, 40_000, seed=1)
    out, _cov = run_build(tmp_path, save(tmp_path / "tf.pt", counts), 700, always_keep_ids=[4999])
    t2d, d2t, t2d_np, d2t_np = load_outputs(out)
    assert t2d.dtype == torch.bool and t2d.shape == (5000,) and int(t2d.sum()) == 700
    assert d2t.dtype == torch.int64 and d2t.shape == (700,)
    assert torch.equal(torch.arange(700) + d2t, t2d.nonzero().squeeze())
    assert bool(t2d[4999])
    assert t2d_np.dtype == np.bool_ and d2t_np.dtype == np.int64
    assert np.array_equal(t2d_np, t2d.numpy()) and np.array_equal(d2t_np, d2t.numpy())
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUT_NAMES)


def test_dict_input_equals_dense(tmp_path):
    counts = zipf_counts(3000, 5000, seed=2)  # many unseen ids
    as_dict = {int(i): int(counts[i]) for i in counts.nonzero().flatten()}
    dense = load_token_counts(save(tmp_path / "d.pt", counts), 3000)
    from_dict = load_token_counts(save(tmp_path / "s.pt", as_dict), 3000)
    assert np.array_equal(dense, counts.numpy()) and np.array_equal(from_dict, dense)
    assert load_token_counts(save(tmp_path / "i32.pt", counts.to(torch.int32))).dtype == np.int64
    for dtype in (torch.float32, torch.bfloat16):  # whole numbers in a float tensor are counts
        whole = save(tmp_path / "f.pt", torch.tensor([0, 3, 17, 256]).to(dtype))
        assert load_token_counts(whole).tolist() == [0, 3, 17, 256]


def test_coverage_report(tmp_path):
    counts = torch.tensor([5, 0, 3, 3, 9, 0, 1, 0])
    _, cov = run_build(tmp_path, save(tmp_path / "tf.pt", counts), 4, always_keep_ids=[7])
    saved = json.loads((tmp_path / "out" / "vocab_coverage.json").read_text())
    assert saved == cov
    assert cov["target_vocab_size"] == 8 and cov["draft_vocab_size"] == 4
    assert cov["total_masked_tokens"] == 21 and cov["distinct_ids_seen"] == 5
    assert cov["always_kept_ids"] == [7]
    assert cov["coverage"] == pytest.approx(17 / 21)  # ids 7, 4, 0, 2
    assert cov["coverage_at_sizes"] == pytest.approx({"1": 0.0, "2": 9 / 21, "4": 17 / 21, "8": 1.0})


def test_coverage_curve_matches_rerunning_the_selection():
    counts = zipf_counts(2048, 3000, seed=3)
    keep = [2047, 11]
    cov = compute_vocab_mapping(counts, 300, keep).coverage
    assert list(cov["coverage_at_sizes"]) == [
        "2",
        "4",
        "8",
        "16",
        "32",
        "64",
        "128",
        "256",
        "300",
        "512",
        "1024",
        "2048",
    ]
    total = int(counts.sum())
    for size, share in cov["coverage_at_sizes"].items():
        ids = compute_vocab_mapping(counts, int(size), keep).selected_ids
        assert share == pytest.approx(int(counts[ids].sum()) / total)


def test_coverage_sizes_for_a_real_vocabulary():
    sizes = coverage_sizes(163_840, 32_000)
    assert {8000, 16000, 32000, 64000, 131072, 163840} <= set(sizes)
    assert max(sizes) == 163_840 and sizes == sorted(set(sizes))


# --------------------------------------------------------------------------------------------
# errors: the file is named, the problem is said, nothing is written


CFG = object()  # stands for "the target config folder" in the table below


def _arange():  # a valid count tensor for the 16-id target
    return torch.arange(16)


# case: (token_freq content, draft size, extra arguments, problem text); target vocab is 16
ERROR_CASES = {
    "2-D": (lambda: torch.arange(16).reshape(4, 4), 4, {}, "expected a 1-D count tensor"),
    "bool": (lambda: torch.arange(16) > 3, 4, {}, "torch.bool"),
    "complex": (lambda: torch.arange(16) * 1j, 4, {}, "torch.complex"),
    "float": (lambda: torch.arange(16) / 3, 4, {}, "non-integral"),
    "nan": (lambda: torch.full((16,), float("nan")), 4, {}, "NaN"),
    "negative": (lambda: torch.arange(16) - 2, 4, {}, "negative counts"),
    "too big": (_arange, 17, {}, "exceeds the target vocabulary size 16"),
    "zero": (_arange, 0, {}, "must be at least 1"),
    "keep out of range": (_arange, 4, {"always_keep_ids": [3, 16]}, "always-kept ids [16]"),
    "keep negative": (_arange, 4, {"always_keep_ids": [-1]}, "always-kept ids [-1]"),
    "too many kept": (_arange, 2, {"always_keep_ids": [1, 2, 3]}, "do not fit"),
    "length vs config": (
        lambda: torch.arange(20),
        4,
        {"target_config": CFG},
        "length 20 but the target vocabulary size is 16",
    ),
    "length vs size": (lambda: torch.arange(20), 4, {"target_vocab_size": 16}, "length 20"),
    "dict out of range": (lambda: {0: 3, 16: 1, 99: 2}, 4, {"target_config": CFG}, "out of range"),
    "dict without size": (lambda: {0: 3}, 1, {}, "does not say the target vocabulary size"),
    "dict float ids": (lambda: {0.5: 3}, 1, {"target_vocab_size": 16}, "integer token ids"),
    "dict negative": (
        lambda: {0: 3, 7: -2},
        1,
        {"target_vocab_size": 16},
        "negative counts (first at ids [7])",
    ),
    "dict float counts": (lambda: {0: 2.5}, 1, {"target_vocab_size": 16}, "non-integral"),
    "not counts": (lambda: [1, 2, 3], 1, {}, "got list"),
    "all zero": (lambda: torch.zeros(16, dtype=torch.int64), 4, {}, "every count is zero"),
    "unreadable": (b"this is not a torch file", 4, {}, "cannot read as a torch file"),
    "missing": (None, 4, {}, "file does not exist"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_bad_input_names_file_and_writes_nothing(tmp_path, case):
    content, n, kw, problem = ERROR_CASES[case]
    path = tmp_path / "token_freq.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content(), path)
    cfg = write_config(tmp_path / "model", {"vocab_size": 16})
    kw = {k: cfg if v is CFG else v for k, v in kw.items()}
    out = tmp_path / "out"
    with pytest.raises(EaglenestError) as err:
        build_vocab_mapping(path, n, MappingPaths.in_dir(out, coverage_plot=out / "c.png"), **kw)
    assert str(path) in str(err.value) and problem in str(err.value)
    assert not out.exists()


@pytest.mark.parametrize(
    "config, problem",
    [
        ({"hidden_size": 8}, "vocab_size must be a positive integer"),
        ({"vocab_size": "big"}, "positive integer"),
    ],
)
def test_bad_target_config(tmp_path, config, problem):
    cfg = write_config(tmp_path / "model", config)
    out = tmp_path / "out"
    freq = save(tmp_path / "tf.pt", torch.arange(16))
    with pytest.raises(EaglenestError, match=problem) as err:
        build_vocab_mapping(freq, 4, MappingPaths.in_dir(out), target_config=cfg)
    assert str(cfg / "config.json") in str(err.value)
    assert not out.exists()


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    """A late failure (the plot) or a rename failing part-way removes what had landed."""
    import eaglenest.core.io
    import eaglenest.data.vocab

    freq = save(tmp_path / "tf.pt", torch.arange(16))
    out = tmp_path / "out"

    def broken_plot(tmp, mapping):
        raise OSError("disk full")

    monkeypatch.setattr(eaglenest.data.vocab, "_plot_into", broken_plot)
    with pytest.raises(OSError, match="disk full"):
        build_vocab_mapping(freq, 4, MappingPaths.in_dir(out, coverage_plot=out / "c.png"))
    assert list(out.iterdir()) == []
    monkeypatch.undo()

    real_replace, calls = os.replace, []

    def flaky_replace(src, dst):
        calls.append(dst)
        if len(calls) == 3:
            raise OSError("rename failed")
        real_replace(src, dst)

    monkeypatch.setattr(eaglenest.core.io.os, "replace", flaky_replace)
    with pytest.raises(OSError, match="rename failed"):
        build_vocab_mapping(freq, 4, MappingPaths.in_dir(out))
    monkeypatch.undo()
    assert list(out.iterdir()) == []


# --------------------------------------------------------------------------------------------
# command line and Snakemake adapter


def test_cli_main_end_to_end(tmp_path, capsys):
    model = write_config(tmp_path / "model", {"vocab_size": 2048})
    freq = save(tmp_path / "tf.pt", zipf_counts(2048, 20_000, seed=4))
    out = tmp_path / "out"
    argv = [
        "vocab-mapping",
        "--token-freq",
        str(freq),
        "--draft-vocab-size",
        "256",
        "--output-dir",
        str(out),
        "--target-model",
        str(model),
        "--always-keep-ids",
        "0",
        "2047",
        "--plot",
        str(tmp_path / "coverage.png"),
    ]
    assert cli.main(argv) == 0
    assert "256 of 2048 ids cover" in capsys.readouterr().out
    t2d, d2t, _, _ = load_outputs(out)
    assert t2d.shape == (2048,) and d2t.shape == (256,) and bool(t2d[0]) and bool(t2d[2047])
    assert (tmp_path / "coverage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cov = json.loads((out / "vocab_coverage.json").read_text())
    assert cov["always_kept_ids"] == [0, 2047] and "256" in cov["coverage_at_sizes"]


def test_cli_reports_bad_input(tmp_path, capsys):
    freq = save(tmp_path / "tf.pt", torch.arange(16))
    argv = [
        "vocab-mapping",
        "--token-freq",
        str(freq),
        "--draft-vocab-size",
        "32",
        "--output-dir",
        str(tmp_path / "out"),
        "--target-vocab-size",
        "16",
    ]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert str(freq) in err and "exceeds the target vocabulary size 16" in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit):  # the target vocabulary size must come from somewhere
        cli.main(argv[:-2])
    assert "one of the arguments --target-model --target-vocab-size is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # ... and from one place only
        cli.main([*argv, "--target-model", str(tmp_path)])
    assert "argument --target-model: not allowed with argument --target-vocab-size" in capsys.readouterr().err


def test_console_script(tmp_path):
    freq = save(tmp_path / "tf.pt", {3: 10, 7: 4, 1: 4})
    out = tmp_path / "out"
    exe = Path(sys.executable).parent / "eaglenest"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [
            str(exe),
            "vocab-mapping",
            "--token-freq",
            str(freq),
            "--draft-vocab-size",
            "4",
            "--target-vocab-size",
            "10",
            "--output-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    t2d, d2t, _, _ = load_outputs(out)
    assert t2d.nonzero().flatten().tolist() == [0, 1, 3, 7]
    assert d2t.tolist() == [0, 0, 1, 4]


def test_snakemake_script(tmp_path):
    from conftest import target_record

    model = write_config(
        tmp_path / "model",
        {"text_config": {"vocab_size": 64, "hidden_size": 8, "num_hidden_layers": 8}, "vocab_size": 3},
    )
    (model / "model.safetensors").write_bytes(b"\0")
    freq = save(tmp_path / "tf.pt", torch.arange(64) % 7)
    out = tmp_path / "results"
    names = dict(
        t2d_pt="t2d.pt",
        d2t_pt="d2t.pt",
        t2d_npy="t2d.npy",
        d2t_npy="d2t.npy",
        coverage="vocab_coverage.json",
        coverage_plot="vocab_coverage.png",
    )
    # Id 7 is rare (count 0: 7 % 7) but tokenize found it in a supervised span (a tool-call
    # marker): it gets a slot anyway.
    metadata = tmp_path / "metadata.json"
    metadata.write_text(json.dumps({"supervised_special_tokens": {"7": "<|tool_call_end|>"}}))
    smk = SimpleNamespace(
        input=SimpleNamespace(
            token_freq=str(freq),
            target=str(target_record(model, tmp_path / "target.json")),
            metadata=str(metadata),
        ),
        params=SimpleNamespace(draft_vocab_size=16, always_keep_ids=[63]),
        output=SimpleNamespace(**{k: str(out / v) for k, v in names.items()}),
        log=[str(tmp_path / "vocab.log")],
    )
    try:
        runpy.run_path(str(REPO / "scripts" / "build_vocab_mapping.py"), init_globals={"snakemake": smk})
    finally:
        logging.getLogger().handlers.clear()  # the script points the root logger at its log
    assert sorted(p.name for p in out.iterdir()) == sorted(names.values())
    t2d, _, _, _ = load_outputs(out)
    assert int(t2d.sum()) == 16 and bool(t2d[63]) and bool(t2d[7])
    coverage = json.loads((out / "vocab_coverage.json").read_text())
    assert coverage["forced_special_tokens"] == {"7": "<|tool_call_end|>"}
    assert "16 of 64 ids cover" in (tmp_path / "vocab.log").read_text()


# --------------------------------------------------------------------------------------------
# speculators: same selection, files its trainer loads


def _as_speculators_dict(counts: torch.Tensor) -> dict[int, int]:
    """What speculators' save_token_frequency_distribution writes: seen ids only."""
    ids = counts.nonzero().flatten()
    return dict(zip(ids.tolist(), counts[ids].tolist()))


@pytest.mark.parametrize(
    "vocab, tokens, draft, seed",
    [
        (4096, 200_000, 512, 0),  # every slot filled by seen ids
        (4096, 300, 512, 1),  # fewer seen ids than slots: padding with lowest unused ids
        (1000, 2_000, 1000, 2),  # draft == target
        (50, 10_000, 7, 3),  # heavy ties
    ],
)
def test_agrees_with_speculators(tmp_path, vocab, tokens, draft, seed):
    """Without always-kept ids, its rules are ours: (-count, id) order, lowest unused fill."""
    counts = zipf_counts(vocab, tokens, seed)
    ref_d2t, ref_t2d = spec_build(_as_speculators_dict(counts), draft, vocab)
    out, _ = run_build(tmp_path, save(tmp_path / "tf.pt", counts), draft)
    t2d, d2t, _, _ = load_outputs(out)
    assert torch.equal(t2d, ref_t2d) and torch.equal(d2t, ref_d2t)


def test_zero_count_dict_entries_are_unseen():
    """Where speculators differs: it ranks ids listed with count 0 before lower unlisted ids.

    Its own counter never writes zeros, so this only matters for hand-made dicts; eaglenest
    treats a listed zero like an unseen id, which keeps the rule "lowest unused ids fill".
    """
    freq = {1: 3, 5: 0}
    _ref_d2t, ref_t2d = spec_build(freq, 3, 8)
    assert ref_t2d.nonzero().flatten().tolist() == [0, 1, 5]
    assert selected([0, 3, 0, 0, 0, 0, 0, 0], 3) == [0, 1, 2]


def test_trainer_loads_the_files(tmp_path):
    """speculators' trainer reads --d2t-path/--t2d-path with `_load_mappings` (np.load)."""
    counts = zipf_counts(3000, 30_000, seed=5)
    out, _ = run_build(tmp_path, save(tmp_path / "tf.pt", counts), 400)
    d2t, t2d, draft = spec_load_mappings(out / "d2t.npy", out / "t2d.npy", 400)
    assert draft == 400
    # the checks and buffer dtypes of SpeculatorModel.load_vocab_mappings
    assert t2d.dtype == torch.bool and d2t.dtype == torch.long
    assert t2d.shape[0] == 3000 and int(t2d.sum(dtype=torch.long).item()) == 400
    assert torch.equal(t2d, torch.load(out / "t2d.pt", weights_only=True))
    assert torch.equal(d2t, torch.load(out / "d2t.pt", weights_only=True))
    with pytest.raises(ValueError, match="--draft-vocab-size requires 512"):
        spec_load_mappings(out / "d2t.npy", out / "t2d.npy", 512)


@pytest.mark.engine
def test_extracted_reference_is_speculators_own(tmp_path):
    """Import the real package (slow) and check the compiled-from-source copies are its code."""
    import inspect

    from speculators.train import cli as spec_cli
    from speculators.train import vocab_mapping as spec_vm

    for module, name in [(spec_vm, "build_vocab_mappings_from_distribution"), (spec_cli, "_load_mappings")]:
        assert inspect.getsource(getattr(module, name)).strip() == _speculators_source(name)[0]
    counts = zipf_counts(4096, 300, seed=1)
    out, _ = run_build(tmp_path, save(tmp_path / "tf.pt", counts), 512)
    d2t, t2d, _ = spec_cli._load_mappings(out / "d2t.npy", out / "t2d.npy", 512)
    ref_d2t, ref_t2d = spec_vm.build_vocab_mappings_from_distribution(_as_speculators_dict(counts), 512, 4096)
    assert torch.equal(d2t, ref_d2t) and torch.equal(t2d, ref_t2d)
