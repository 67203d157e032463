"""Sweeps: variants planned from the config, nested data subsets, the trainer's estimate of
served acceptance, the data-scaling fit, and a real two-variant sweep (P-EAGLE and DFlash) on
the default run."""

from __future__ import annotations

import copy
import itertools
import json
import math
import shutil

import pandas as pd
import pytest
from conftest import default_config, job_timeline, planned_jobs, snakemake, write_config
from safetensors.torch import load_file

from eaglenest.core.errors import EaglenestError
from eaglenest.draft.config import draft_parameter_count
from eaglenest.report.variant_comparison import compare_stage, fit_data_scaling, validation_estimate
from eaglenest.training.sweep import plan_variants, train_hp, training_subset

VARIANT_RULES = {
    "build_vocab_mapping_variant",
    "draft_config_variant",
    "train_draft_variant",
    "export_draft_variant",
    "evaluate_acceptance_variant",
}


def with_sweep(**sweep) -> dict:
    cfg = default_config()
    cfg["sweep"] = sweep
    return cfg


def test_grid_takes_every_combination_and_the_configs_own_is_the_base():
    variants = plan_variants(with_sweep(data_fraction=[0.5, 1.0], draft_vocab_size=[256, 1024]))
    assert [(v.name, v.is_base) for v in variants] == [
        ("frac1-vocab1024", True),
        ("frac0.5-vocab256", False),
        ("frac0.5-vocab1024", False),
        ("frac1-vocab256", False),
    ]
    # Settings not swept keep the config's values.
    assert all(v.settings["lr"] == 0.003 and v.settings["epochs"] == 8 for v in variants)


def test_one_at_a_time_varies_each_setting_around_the_configs_values():
    cfg = with_sweep(combine="one_at_a_time", data_fraction=[0.25, 0.5], lr=[0.001, 0.003])
    names = [v.name for v in plan_variants(cfg)]
    assert names == ["frac1-lr0.003", "frac0.25-lr0.003", "frac0.5-lr0.003", "frac1-lr0.001"]


def test_without_a_sweep_there_are_no_variants():
    assert plan_variants(default_config()) == []
    cfg = default_config()
    cfg["sweep"] = None
    assert plan_variants(cfg) == []


def test_a_sweep_that_varies_nothing_or_subsets_hybrid_hidden_states_is_refused():
    with pytest.raises(EaglenestError, match="lists no setting"):
        plan_variants(with_sweep(combine="grid"))
    cfg = with_sweep(data_fraction=[0.5])
    cfg["hidden_states"]["mode"] = "hybrid"
    with pytest.raises(EaglenestError, match="hybrid"):
        plan_variants(cfg)
    cfg["sweep"] = {"data_fraction": [1.0], "lr": [0.01]}
    assert len(plan_variants(cfg)) == 2  # all rows: hybrid's kept samples stay valid


def test_a_variants_training_params_are_the_runs_with_its_settings():
    cfg = with_sweep(ttt_steps=[2], draft_layers=[2], epochs=[1], lr=[0.01], data_fraction=[0.5])
    variant = plan_variants(cfg)[1]
    hp = train_hp(cfg, variant.settings)
    assert {k: hp[k] for k in ("ttt_steps", "draft_layers", "epochs", "lr", "data_fraction")} == {
        "ttt_steps": 2,
        "draft_layers": 2,
        "epochs": 1,
        "lr": 0.01,
        "data_fraction": 0.5,
    }
    rest = {k: v for k, v in cfg["train"].items() if k not in variant.settings}
    assert {k: v for k, v in hp.items() if k not in variant.settings} == rest


def with_sources(**sweep) -> dict:
    cfg = with_sweep(**sweep)
    cfg["prompts"]["sources"] = [
        {"name": "chat", "type": "bundled"},
        {"name": "code", "type": "jsonl", "path": "code.jsonl", "responses": "dataset"},
        {"name": "tools", "type": "bfcl"},
    ]
    return cfg


def test_a_sources_sweep_names_its_variants_by_source_and_trains_them_on_those_rows_alone():
    cfg = with_sources(combine="one_at_a_time", sources=[["code"], ["tools", "chat"]], data_fraction=[0.5])
    variants = plan_variants(cfg)
    # A list's names in the config's source order; the base holds every source.
    assert [v.name for v in variants] == [
        "frac1-srcall",
        "frac0.5-srcall",
        "frac1-srccode",
        "frac1-srcchat+tools",
    ]
    hp = {v.name: train_hp(cfg, v.settings) for v in variants}
    assert "sources" not in hp["frac1-srcall"] and "sources" not in hp["frac0.5-srcall"]
    assert hp["frac1-srcchat+tools"]["sources"] == ["chat", "tools"]
    with pytest.raises(
        EaglenestError, match=r"names no prompt source 'docs' \(prompts.sources: chat, code, tools\)"
    ):
        plan_variants(with_sources(sources=[["code", "docs"]]))
    for bad in ([], "code"):
        with pytest.raises(EaglenestError, match="non-empty list of source names"):
            plan_variants(with_sources(sources=[bad]))
    hybrid = with_sources(sources=[["code"]])
    hybrid["hidden_states"]["mode"] = "hybrid"
    with pytest.raises(EaglenestError, match="hybrid"):
        plan_variants(hybrid)


def test_a_sources_variant_trains_on_its_sources_rows_and_validates_on_the_runs(tmp_path):
    from eaglenest.training.data_folder import data_fraction_rows

    n, ratio = 400, 0.9
    sources = ["chat" if i % 3 else "code" for i in range(n)]
    # Rows keep their prompt's id, or add a turn (#k) or response (:k) number to it.
    ids = [f"p{i}" + ("#1" if i % 5 == 0 else ":2" if i % 7 == 0 else "") for i in range(n)]
    tokenized, prompts = tmp_path / "tokenized.jsonl", tmp_path / "prompts.jsonl"
    tokenized.write_text(
        "".join(json.dumps({"id": r, "input_ids": [1], "loss_mask": [1]}) + "\n" for r in ids)
    )
    prompts.write_text(
        "".join(json.dumps({"id": f"p{i}", "source": s}) + "\n" for i, s in enumerate(sources))
    )
    hp = {"train_data_ratio": ratio, "seed": 0, "data_fraction": 1.0}
    split = int(n * ratio)
    rows, code_hp, count = data_fraction_rows(tokenized, {**hp, "sources": ["code"]}, prompts)
    trained = rows[: int(count * code_hp["train_data_ratio"])]
    assert trained == [i for i in range(split) if sources[i] == "code"]
    assert rows[len(trained) :] == list(range(split, n))  # the run's validation rows, whole
    half, *_ = data_fraction_rows(tokenized, {**hp, "sources": ["code"], "data_fraction": 0.5}, prompts)
    assert set(half) < set(rows) and set(range(split, n)) <= set(half)
    assert data_fraction_rows(tokenized, hp, prompts)[0] is None  # every row: no subset
    with pytest.raises(EaglenestError, match="needs the training prompts"):
        data_fraction_rows(tokenized, {**hp, "sources": ["code"]})
    prompts.write_text(json.dumps({"id": "p0", "source": "chat"}) + "\n")
    with pytest.raises(EaglenestError, match="has no prompt in"):
        data_fraction_rows(tokenized, {**hp, "sources": ["code"]}, prompts)


def speculators_rows(datapath, ratio: float, split: str) -> list[int]:
    """The rows speculators' own dataset trains (or validates) on, of a data folder whose `row`
    column names the tokenized row each position holds (the trainer's data folder renumbers a
    subset's rows in its order)."""
    from speculators.train.data import ArrowDataset

    data = ArrowDataset(max_len=64, datapath=datapath, train_ratio=ratio, split=split, on_missing="raise")
    return list(data.data["row"])


class HeldRows:
    """What speculators' ArrowDataset reads of a loaded dataset (its length, a selection, the
    lengths column), held in memory: to run its split for hundreds of sizes in a second."""

    def __init__(self, rows):
        self.rows = list(rows)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, column):
        return {"row": self.rows, "seq_len": [1] * len(self.rows)}[column]

    def select(self, indices):
        return HeldRows(self.rows[i] for i in indices)

    def with_format(self, _):
        return self


def test_data_subsets_are_nested_and_keep_the_validation_rows_whole(tmp_path):
    from datasets import Dataset

    n, ratio = 2000, 0.9

    def saved(name, rows):
        Dataset.from_dict({"row": rows, "seq_len": [1] * len(rows)}).save_to_disk(tmp_path / name)
        return tmp_path / name

    full = saved("full", list(range(n)))
    full_train, validation = speculators_rows(full, ratio, "train"), speculators_rows(full, ratio, "val")
    subsets = {f: training_subset(n, ratio, f, seed=0) for f in (0.25, 0.5, 0.75)}
    for f, (rows, r) in subsets.items():
        folder = saved(str(f), rows)
        trained = speculators_rows(folder, r, "train")
        # speculators trains on the kept training rows only and validates on the full data's
        # validation rows, so validation compares across fractions.
        assert trained == [i for i in rows if i in set(full_train)]
        assert speculators_rows(folder, r, "val") == validation
        assert abs(len(trained) / len(full_train) - f) < 0.05
    small, mid, large = (set(subsets[f][0]) for f in (0.25, 0.5, 0.75))
    assert small < mid < large
    assert training_subset(n, ratio, 0.5, seed=1)[0] != subsets[0.5][0]  # the seed picks


def test_speculators_split_lands_on_the_subset_for_every_size(monkeypatch):
    import speculators.train.data

    held = {}
    monkeypatch.setattr(speculators.train.data, "load_from_disk", lambda path: HeldRows(held[path]))
    for n in range(3, 400):
        held["full"] = range(n)
        # 1 leaves speculators no validation split: refused at start (test_config_schema.py).
        for ratio in (0.8, 0.9, 0.95):
            try:
                held["subset"], r = training_subset(n, ratio, 0.3, seed=2)
            except EaglenestError:  # a small split may keep no row: refused, as tested below
                continue
            full_train = set(speculators_rows("full", ratio, "train"))
            trained = speculators_rows("subset", r, "train")
            assert trained == [i for i in held["subset"] if i in full_train], (n, ratio)
            assert speculators_rows("subset", r, "val") == speculators_rows("full", ratio, "val"), (n, ratio)


def test_a_fraction_that_keeps_no_row_is_refused():
    with pytest.raises(EaglenestError, match="keeps none of the 2 training rows"):
        training_subset(3, 0.9, 1e-9, seed=0, source="tokenized.jsonl")


def metrics(cond: list[float]) -> dict:
    val = {f"cond_acc_{p}_epoch": c for p, c in enumerate(cond)}
    return {"per_epoch": [{"epoch": 0, "val": {"cond_acc_0_epoch": 0.1}}, {"epoch": 1, "val": val}]}


def test_the_trainers_estimate_multiplies_conditional_accuracies_of_the_last_epoch():
    est = validation_estimate(metrics([0.8, 0.5, 0.5]), k=3)
    assert est["per_position"] == pytest.approx([0.8, 0.4, 0.2])
    assert est["tokens_per_draft"] == pytest.approx(2.4)
    # A draft unrolled over fewer steps than k has no estimate for the positions past them.
    short = validation_estimate(metrics([0.8, 0.5]), k=3)
    assert short["per_position"] == pytest.approx([0.8, 0.4]) and short["tokens_per_draft"] is None


def test_data_scaling_fit_recovers_a_log_linear_law_and_caps_at_the_ceiling():
    rows = [100, 200, 400]
    fit = fit_data_scaling(rows, [1.5 + 0.25 * math.log2(r / 100) for r in rows], ceiling=4.0)
    assert fit["per_doubling"] == pytest.approx(0.25)
    assert fit["estimated_gain_from_doubling"] == pytest.approx(0.25)
    assert fit["last_step_estimated_gain_from_doubling"] == pytest.approx(0.25)
    # A flattening curve: the last step's slope is below the fit's, and both are reported.
    bending = fit_data_scaling(rows, [2.0, 2.6, 2.7], ceiling=4.0)
    assert bending["last_step_rows"] == [200, 400]
    assert bending["last_step_estimated_gain_from_doubling"] == pytest.approx(0.1)
    assert bending["estimated_gain_from_doubling"] == pytest.approx(0.35)
    assert fit["doubled_rows"] == 800 and fit["max_abs_residual"] == pytest.approx(0, abs=1e-9)
    capped = fit_data_scaling(rows, [3.0, 3.5, 3.9], ceiling=4.0)
    assert capped["estimate_at_doubled"] == 4.0
    assert fit_data_scaling([100, 100], [1.0, 1.1], ceiling=4.0) is None


def write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)
    return str(path)


def test_comparison_sets_each_variant_beside_the_trainers_estimate(tmp_path):
    cfg = with_sweep(data_fraction=[0.25, 0.5, 1.0])
    variants = plan_variants(cfg)
    served = {"frac1": 2.6, "frac0.25": 1.8, "frac0.5": 2.2}
    files: dict[str, list] = {"acc": [], "metrics": [], "coverage": [], "bench": []}
    for v in variants:
        tokens = served[v.name]
        draft = {
            "mean_acceptance_length": tokens,
            "mean_acceptance_length_per_draft": tokens - 0.01,
            "acceptance_rate": (tokens - 1) / 3,
            "per_position_acceptance": [0.7, 0.5, 0.3],
            "output_tokens_per_s": 600.0 * tokens / 2,
            "lossless": True,
        }
        rows = int(1000 * v.settings["data_fraction"])
        # MT-Bench a token per step below the held-out prompts, its first position accepted less.
        mt_bench = draft | {"mean_acceptance_length": tokens - 1, "per_position_acceptance": [0.4, 0.2]}
        acceptance = {"draft": draft, "benchmarks": {"mt_bench": {"conversations": 4, "draft": mt_bench}}}
        files["acc"].append(write(tmp_path / v.name / "acc.json", acceptance))
        m = metrics([0.7, 0.6, 0.5]) | {"train_rows": rows}
        files["metrics"].append(write(tmp_path / v.name / "m.json", m))
        files["coverage"].append(write(tmp_path / v.name / "c.json", {"coverage": 0.9}))
        files["bench"].append(
            write(tmp_path / v.name / "b.tsv", "s\th:m:s\tmax_rss\tcpu_time\n12.5\t0\t1\t2\n")
        )
    reference = write(
        tmp_path / "ref.json", {"num_speculative_tokens": 3, "no_spec": {"output_tokens_per_s": 600.0}}
    )
    out = tmp_path / "sweep"
    compare_stage(
        names=[v.name for v in variants],
        settings=[v.settings for v in variants],
        base=[v.is_base for v in variants],
        acceptance_files=files["acc"],
        metrics_files=files["metrics"],
        coverage_files=files["coverage"],
        train_benchmarks=files["bench"],
        reference_acceptance=reference,
        keys=["data_fraction"],
        out_csv=out / "comparison.csv",
        out_plot=out / "comparison.png",
        out_per_position=out / "per_position.png",
        out_scaling=out / "data_scaling.json",
        out_scaling_plot=out / "data_scaling.png",
    )
    table = pd.read_csv(out / "comparison.csv")
    assert list(table["variant"]) == ["frac1", "frac0.25", "frac0.5"]
    assert list(table["base"]) == [True, False, False]
    assert list(table["train_rows"]) == [1000, 250, 500]
    assert table["val_estimate_tokens_per_draft"].tolist() == pytest.approx([1 + 0.7 + 0.42 + 0.21] * 3)
    assert table["speedup_vs_no_spec"].tolist() == pytest.approx([1.3, 0.9, 1.1])
    assert table["train_s"].tolist() == [12.5] * 3
    assert table["mt_bench_tokens_per_step"].tolist() == pytest.approx([1.6, 0.8, 1.2])
    assert table["mt_bench_accept_pos_1"].tolist() == pytest.approx([0.4] * 3)
    assert table["mt_bench_accept_pos_3"].isna().all()  # a position the file does not hold
    fits = {f["set"]: f for f in json.loads((out / "data_scaling.json").read_text())["fits"]}
    assert set(fits) == {"held out", "mt_bench"}
    for fit in fits.values():
        assert fit["largest_rows"] == 1000 and fit["doubled_rows"] == 2000
        assert fit["per_doubling"] == pytest.approx(0.4, abs=0.01)
    assert fits["mt_bench"]["fitted_at_largest"] == pytest.approx(fits["held out"]["fitted_at_largest"] - 1)
    for png in ("comparison.png", "per_position.png", "data_scaling.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_an_algorithm_sweep_is_drawn_as_points_in_the_variants_order():
    # Algorithms have no order: joining them by lines (or sorting them by name) would show a
    # trend that is not there. Numbers keep their lines.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from eaglenest.report.variant_comparison import _draw_setting

    def row(algorithm, fraction, tokens):
        return {
            "algorithm": algorithm,
            "data_fraction": fraction,
            "tokens_per_step": tokens,
            "val_estimate_tokens_per_draft": None,
            "output_tokens_per_s": 100.0,
        }

    _, (acc, tps) = plt.subplots(2)
    rows = [row("eagle3", 1.0, 1.15), row("p_eagle", 1.0, 1.12), row("dflash", 1.0, 1.11)]
    _draw_setting(acc, tps, rows, "algorithm", ["algorithm"])
    assert [t.get_text() for t in acc.get_xticklabels()] == ["eagle3", "p_eagle", "dflash"]
    points = dict(zip(acc.lines[0].get_xdata(), acc.lines[0].get_ydata(), strict=True))
    assert points == {0: 1.15, 1: 1.12, 2: 1.11}  # each algorithm above its own tick
    assert all(line.get_linestyle() == "None" for line in acc.lines + tps.lines)

    _, (acc, tps) = plt.subplots(2)
    rows = [row("eagle3", 1.0, 1.15), row("eagle3", 0.25, 1.04), row("eagle3", 0.5, 1.08)]
    _draw_setting(acc, tps, rows, "data_fraction", ["data_fraction"])
    assert list(acc.lines[0].get_xdata()) == [0.25, 0.5, 1.0]
    assert acc.lines[0].get_linestyle() == "-"
    plt.close("all")


def test_a_variants_reference_outputs_must_cover_its_prompts_and_turns(tmp_path):
    from eaglenest.evaluation.asking import reference_answers

    ref = tmp_path / "outputs.jsonl"
    rows = [
        {"method": "no_spec", "id": "a", "token_ids": [1], "text": "x"},  # an older file: no set
        {"method": "draft", "id": "b", "token_ids": [1], "text": "x"},
        {"method": "no_spec", "set": "mt", "id": "q1", "turn": 0, "token_ids": [2], "text": "y"},
    ]
    ref.write_text("".join(json.dumps(r) + "\n" for r in rows))
    conv = {"benchmark": "mt", "mode": "default", "id": "q1", "turns": ["first", "second"]}

    def held_out(*ids):
        return [{"benchmark": "held_out", "mode": "default", "id": i, "messages": []} for i in ids]

    found = reference_answers(ref, [*held_out("a"), {**conv, "turns": ["first"]}])
    assert found[("held_out", "default", "a", 0)]["text"] == "x"
    assert found[("mt", "default", "q1", 0)]["text"] == "y"
    with pytest.raises(EaglenestError, match=r"outputs.jsonl.*no no_spec output for 1 of the 2 .*first: b"):
        reference_answers(ref, held_out("a", "b"))
    with pytest.raises(
        EaglenestError, match=r"no no_spec output for 1 of the 3 .*q1, turn 2 of mt in mode default"
    ):
        reference_answers(ref, [*held_out("a"), conv])
    # A mode the reference was not asked in is not covered by it.
    with pytest.raises(EaglenestError, match=r"first: a, turn 1 of held_out in mode instant"):
        reference_answers(ref, [{**held_out("a")[0], "mode": "instant"}])
    # A conversation the reference left out for want of room (its acceptance.json says so) needs
    # no answer from the turn it was cut at: the variant's room check leaves it out too.
    (tmp_path / "acceptance.json").write_text(
        json.dumps(
            {
                "no_spec": {"conversations_cut_too_long": ["b"]},
                "benchmarks": {"mt": {"no_spec": {"conversations_cut_too_long": ["q1"]}}},
            }
        )
    )
    found = reference_answers(ref, [*held_out("a", "b"), conv])
    assert ("mt", "default", "q1", 0) in found and ("held_out", "default", "b", 0) not in found
    with pytest.raises(EaglenestError, match=r"first: q1, turn 1 of held_out"):
        reference_answers(ref, held_out("a", "q1"))  # cut in mt, not in the held-out split


def test_a_subset_links_each_picked_row_to_its_own_hidden_states(tmp_path):
    from datasets import load_from_disk

    from eaglenest.training.data_folder import link_training_data

    tokenized = tmp_path / "tokenized.jsonl"
    tokenized.write_text(
        "".join(json.dumps({"input_ids": [i, i], "loss_mask": [0, 1]}) + "\n" for i in range(6))
    )
    shards = [tmp_path / "shard_0", tmp_path / "shard_1"]
    for k, shard in enumerate(shards):
        shard.mkdir()
        for i in range(3 * k, 3 * k + 3):
            (shard / f"hs_{i}.safetensors").write_text(str(i))
    data = link_training_data(tokenized, shards, tmp_path / "data", rows=[4, 1, 5])
    linked = sorted((data / "hidden_states").iterdir())
    assert [(f.name, f.read_text()) for f in linked] == [
        ("hs_0.safetensors", "4"),
        ("hs_1.safetensors", "1"),
        ("hs_2.safetensors", "5"),
    ]
    assert [r["input_ids"].tolist() for r in load_from_disk(str(data))] == [[4, 4], [1, 1], [5, 5]]


def test_a_sweep_plans_its_variants_on_one_set_of_upstream_jobs(tmp_path):
    cfg = with_sweep(data_fraction=[0.5, 1.0], draft_vocab_size=[256])
    jobs = planned_jobs(snakemake(tmp_path, write_config(tmp_path, cfg), "-n", timeout=300))
    upstream = (
        "regenerate_responses",
        "tokenize",
        "plan_hidden_states",
        "train_draft",
        "evaluate_acceptance",
    )
    assert {rule: jobs[rule] for rule in upstream} == dict.fromkeys(upstream, 1)
    assert jobs["extract_hidden_states"] == cfg["hidden_states"]["num_shards"]
    # frac0.5-vocab256 and frac1-vocab256; frac1 at the config's 1024 is the run's own draft.
    assert {rule: jobs[rule] for rule in VARIANT_RULES} == dict.fromkeys(VARIANT_RULES, 2)
    assert jobs["compare_variants"] == 1


def test_without_a_sweep_the_plan_has_no_variant(tmp_path):
    jobs = planned_jobs(snakemake(tmp_path, write_config(tmp_path, default_config()), "-n", timeout=300))
    assert not (VARIANT_RULES | {"compare_variants"}) & set(jobs)


def test_an_unknown_sweep_setting_stops_the_workflow_naming_it(tmp_path):
    cfg = with_sweep(batch_size=[1, 2])
    proc = snakemake(tmp_path, write_config(tmp_path, cfg), "-n", check=False, timeout=300)
    assert proc.returncode != 0 and "batch_size" in proc.stdout + proc.stderr


@pytest.mark.engine
def test_two_variant_sweep_reuses_the_default_runs_upstream_and_serves_p_eagle_and_dflash_in_parallel(
    default_run, tmp_path
):
    """A real two-variant sweep on a copy of the shared default run: P-EAGLE and DFlash (the
    minute-scale smoke runs of docs/guide/drafters.md), one epoch on a quarter of the rows and a
    smaller draft vocabulary, through training, export and vLLM's evaluation, on the run's own
    hidden states, beside the run's own EAGLE-3 draft. The copy keeps every file's time (and
    Snakemake's records), so it is the finished run as a user would sweep it, and the variants
    and their server starts stay out of what the other tests read."""
    workdir = tmp_path / "default_run"
    shutil.copytree(default_run["workdir"], workdir, symlinks=True)
    run_dir = workdir / default_run["run_dir"].relative_to(default_run["workdir"])
    cfg = copy.deepcopy(default_run["config"])
    cfg["sweep"] = {
        "data_fraction": [0.25],
        "draft_vocab_size": [256],
        "epochs": [1],
        "draft_layers": [2],  # DFlash's second layer is the one vLLM's CPU kernel got wrong (vllm_cpu_dflash)
        "algorithm": ["p_eagle", "dflash"],
    }
    configfile = write_config(workdir, cfg, "sweep.yaml")
    upstream = [
        run_dir / "responses" / "raw_responses.jsonl",
        run_dir / "tokenized" / "tokenized_data.jsonl",
        *sorted((run_dir / "hidden_states").glob("shard_*/manifest.json")),
        run_dir / "draft" / "model.safetensors",
        run_dir / "eval" / "acceptance.json",
    ]
    stamps = {p: p.stat().st_mtime_ns for p in upstream}

    planned = planned_jobs(snakemake(workdir, configfile, "-n"))
    assert set(planned) == VARIANT_RULES | {"compare_variants", "all"}
    assert all(planned[rule] == 2 for rule in VARIANT_RULES)

    proc = snakemake(workdir, configfile, "--cores", "2")
    ran = set(planned_jobs(proc))
    assert ran == VARIANT_RULES | {"compare_variants", "all"}  # nothing upstream ran again
    # The variants' GPU jobs declare the run's GPUs, as the run's own: one at a time.
    gpu_jobs = sorted(
        (j["start"], j["end"])
        for j in job_timeline(proc.events)
        if j["rule"] in {"train_draft_variant", "evaluate_acceptance_variant"}
    )
    assert len(gpu_jobs) == 4
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(gpu_jobs))
    assert {p: p.stat().st_mtime_ns for p in upstream} == stamps

    names = ["frac0.25-vocab256-layers2-epochs1-p_eagle", "frac0.25-vocab256-layers2-epochs1-dflash"]
    exported, masks, servers = {}, {}, {}
    server_logs = list((run_dir / ".eaglenest" / "server").glob("server-*.log"))
    for name in names:
        variant = run_dir / "variants" / name
        exported[name] = json.loads((variant / "draft" / "config.json").read_text())
        assert exported[name]["draft_vocab_size"] == 256
        assert exported[name]["transformer_layer_config"]["num_hidden_layers"] == 2
        acc = json.loads((variant / "eval" / "acceptance.json").read_text())
        assert acc["draft"]["lossless"] is True and acc["draft"]["drafting_steps"] > 0
        masks[name] = json.loads((variant / "draft_config.json").read_text())["eaglenest"]["mask_token"]
        assert exported[name]["mask_token_id"] == masks[name]["id"]
        (servers[name],) = [f for f in server_logs if f"{variant}/draft" in f.read_text(errors="replace")]

    # P-EAGLE: its depth in the export, and the server evaluation started for it asked vLLM for
    # parallel drafting, and vLLM took it.
    p_eagle, dflash = (exported[n] for n in names)
    assert p_eagle["speculators_model_type"] == "peagle"
    depths = cfg["draft"]["p_eagle"]["num_depths"]
    assert p_eagle["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == depths
    assert "'parallel_drafting': True" in servers[names[0]].read_text(errors="replace")

    # DFlash: a block of k + 1 slots trained non-causal, served by vLLM's dflash method; its
    # folder holds exactly the weights draft_parameter_count counts (no embedding: the target's).
    k = cfg["evaluate"]["num_speculative_tokens"]
    assert dflash["speculators_model_type"] == "dflash" and dflash["block_size"] == k + 1
    assert dflash["sliding_window_non_causal"] is True and dflash["sample_from_anchor"] is False
    assert dflash["aux_hidden_state_layer_ids"] == p_eagle["eagle_aux_hidden_state_layer_ids"]
    assert "'method': 'dflash'" in servers[names[1]].read_text(errors="replace")
    weights = load_file(run_dir / "variants" / names[1] / "draft" / "model.safetensors")
    assert "embed_tokens.weight" not in weights
    draft_config = json.loads((run_dir / "variants" / names[1] / "draft_config.json").read_text())
    floats = sum(w.numel() for w in weights.values() if w.is_floating_point())
    assert floats == draft_parameter_count(draft_config)

    table = pd.read_csv(run_dir / "sweep" / "comparison.csv")
    base = f"frac1-vocab{cfg['vocab']['draft_vocab_size']}-layers{cfg['train']['draft_layers']}-epochs{cfg['train']['epochs']}-eagle3"
    assert list(table["variant"]) == [base, *names]
    assert list(table["algorithm"]) == ["eagle3", "p_eagle", "dflash"]
    base_rows = table["train_rows"].iloc[0]
    assert all(0 < r < base_rows / 2 for r in table["train_rows"].iloc[1:])
    assert table["tokens_per_step"].between(1, k + 1).all()
    # speculators' parallel drafters record no conditional accuracy: no trainer's estimate for them.
    assert table["val_estimate_tokens_per_draft"].isna().tolist() == [False, True, True]

    assert planned_jobs(snakemake(workdir, configfile, "-n")) == {}
    report = workdir / "sweep_report.html"
    snakemake(workdir, configfile, "--report", str(report))
    assert "comparison.csv" in report.read_text(errors="replace")
