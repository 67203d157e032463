"""The default pipeline end to end with the real engines, and what a user relies on in its files.

One session-scoped run (tests/conftest.py: `default_run`) feeds every test here.
"""

from __future__ import annotations

import itertools
import json
import shutil

import numpy as np
import pytest
import torch
from conftest import (
    GPU_RULES,
    assert_shard_matches_transformers,
    job_timeline,
    planned_jobs,
    snakemake,
    write_config,
)
from safetensors.torch import load_file

pytestmark = pytest.mark.engine


def read_jsonl(path):
    return [json.loads(line) for line in open(path)]


def test_run_produces_a_draft_that_beats_the_untrained_one(default_run):
    acc = json.loads((default_run["run_dir"] / "eval" / "acceptance.json").read_text())
    for method in ("no_spec", "ngram", "untrained_draft", "draft"):
        for key in (
            "mean_acceptance_length",
            "acceptance_rate",
            "per_position_acceptance",
            "output_tokens_per_s",
            "lossless",
        ):
            assert key in acc[method], (method, key)
    k = default_run["config"]["evaluate"]["num_speculative_tokens"]
    assert len(acc["draft"]["per_position_acceptance"]) == k
    assert acc["draft"]["drafting_steps"] > 0
    # A margin that means something: 1.00 is what an untrained draft gets (every token rejected).
    assert acc["draft"]["mean_acceptance_length"] >= 1.5 * acc["untrained_draft"]["mean_acceptance_length"]


def test_no_acceptance_figure_passes_its_ceiling_and_both_definitions_are_given(default_run):
    """At k drafted tokens a target step yields at most k + 1: per request, per set, per category
    and overall, in both definitions acceptance.json names."""
    import pandas as pd

    run = default_run["run_dir"]
    acc = json.loads((run / "eval" / "acceptance.json").read_text())
    k = acc["num_speculative_tokens"]
    assert set(acc["definitions"]) == {"mean_acceptance_length", "mean_acceptance_length_per_draft"}
    figures = [acc[m] for m in ("ngram", "untrained_draft", "draft")]
    figures += [b[m] for b in acc["benchmarks"].values() for m in ("ngram", "untrained_draft", "draft")]
    for f in figures:
        for key in acc["definitions"]:
            assert 1 <= f[key] <= k + 1, (key, f)
    requests = pd.read_csv(run / "eval" / "requests.csv")
    assert requests["tokens_per_step"].between(1, k + 1).all(), requests.nlargest(3, "tokens_per_step")
    assert (requests["target_steps"] > requests["drafting_steps"]).all()  # the prefill's step at least
    table = pd.read_csv(run / "eval" / "benchmarks.csv")
    for key in acc["definitions"]:
        assert table[key].between(1, k + 1).all(), key


def test_training_curves_hold_every_epoch(default_run):
    metrics = json.loads((default_run["run_dir"] / "train" / "train_metrics.json").read_text())
    epochs = default_run["config"]["train"]["epochs"]
    assert [m["epoch"] for m in metrics["per_epoch"]] == list(range(epochs))
    for m in metrics["per_epoch"]:
        for split in ("train", "val"):
            assert 0 <= m[split]["full_acc_0_epoch"] <= 1 and m[split]["loss_epoch"] > 0
    first, last = metrics["per_epoch"][0], metrics["per_epoch"][-1]
    for split in ("train", "val"):  # training learns: loss falls, first-token accuracy rises
        assert last[split]["loss_epoch"] < 0.8 * first[split]["loss_epoch"], split
        assert last[split]["full_acc_0_epoch"] > first[split]["full_acc_0_epoch"], split


def test_speculation_is_lossless(default_run):
    acc = json.loads((default_run["run_dir"] / "eval" / "acceptance.json").read_text())
    for method in ("ngram", "untrained_draft", "draft"):
        assert acc[method]["lossless"], (method, acc[method]["prompts_differing"])


def test_mt_bench_is_evaluated_turn_by_turn_beside_the_held_out_split(default_run):
    """The default config evaluates 16 of MT-Bench's questions (beside GSM8K's and AlpacaEval's),
    both turns, every method: per
    category in benchmarks.csv, per request in requests.csv, the second turn asked after
    no_spec's own first answer."""
    import pandas as pd

    run, methods = default_run["run_dir"], ("no_spec", "ngram", "untrained_draft", "draft")
    spec = next(b for b in default_run["config"]["evaluate"]["benchmarks"] if b["name"] == "mt_bench")
    mt = json.loads((run / "eval" / "acceptance.json").read_text())["benchmarks"]["mt_bench"]
    assert mt["conversations"] == spec["samples"]
    for method in ("ngram", "untrained_draft", "draft"):
        assert mt[method]["lossless"], (method, mt[method]["prompts_differing"])
        assert mt[method]["per_position_acceptance"] is not None
    requests = pd.read_csv(run / "eval" / "requests.csv", dtype={"id": str})
    on_mt = requests[requests["set"] == "mt_bench"]
    cut = len(mt["draft"]["conversations_cut_too_long"])
    assert set(on_mt["turn"]) == {1, 2} and (on_mt["turn"] == 1).sum() == 4 * spec["samples"]
    assert len(on_mt) == 4 * (2 * spec["samples"] - cut) and set(on_mt["method"]) == set(methods)
    # A second turn carries the first and its answer: a longer prompt than its first turn.
    turns = (
        on_mt[on_mt["method"] == "draft"].pivot(index="id", columns="turn", values="prompt_tokens").dropna()
    )
    assert len(turns) and (turns[2] > turns[1]).all()
    # vLLM rendered the second turn with no_spec's first answer in it, to the token.
    from transformers import AutoTokenizer

    from eaglenest.data.benchmarks import turn_messages

    tok = AutoTokenizer.from_pretrained(run / "target")
    convs = {c["id"]: c for c in read_jsonl(run / "prompts" / "benchmarks.jsonl")}
    for conv_id in turns.index[:4]:
        first = conversation_turn(run, "no_spec", conv_id)
        messages = turn_messages(convs[conv_id], 1, [first["text"]])
        rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert len(tok(rendered, add_special_tokens=False)["input_ids"]) == turns.loc[conv_id, 2]
    table = pd.read_csv(run / "eval" / "benchmarks.csv")
    configured = {b["name"] for b in default_run["config"]["evaluate"]["benchmarks"]}
    assert {"held_out", *configured} == set(table["set"])
    categories = set(table[(table["set"] == "mt_bench")]["category"])
    assert "all" in categories and len(categories) > 2
    whole = (table["mode"] == "all") & (table["traffic"] == "all") & (table["span"] == "all")
    overall = table[
        whole & (table["set"] == "mt_bench") & (table["category"] == "all") & (table["method"] == "draft")
    ]
    assert overall["mean_acceptance_length"].item() == pytest.approx(mt["draft"]["mean_acceptance_length"])


def conversation_turn(run, method, conv_id, turn=0):
    rows = read_jsonl(run / "eval" / "outputs.jsonl")
    return next(
        r for r in rows if (r["method"], r["set"], r["id"], r["turn"]) == (method, "mt_bench", conv_id, turn)
    )


def test_vocab_mapping_files_follow_the_speculators_format(default_run):
    vocab = default_run["run_dir"] / "vocab"
    n = default_run["config"]["vocab"]["draft_vocab_size"]
    target_cfg = json.loads((default_run["run_dir"] / "target" / "config.json").read_text())
    t2d = torch.load(vocab / "t2d.pt", weights_only=True)
    d2t = torch.load(vocab / "d2t.pt", weights_only=True)
    assert t2d.dtype == torch.bool and t2d.shape == (target_cfg["vocab_size"],)
    assert d2t.dtype == torch.int64 and d2t.shape == (n,)
    assert int(t2d.sum()) == n
    assert torch.equal(torch.arange(n) + d2t, t2d.nonzero().squeeze(1))
    assert np.array_equal(np.load(vocab / "t2d.npy"), t2d.numpy())
    assert np.array_equal(np.load(vocab / "d2t.npy"), d2t.numpy())


def test_token_freq_counts_exactly_the_loss_masked_tokens(default_run):
    tok = default_run["run_dir"] / "tokenized"
    freq = torch.load(tok / "token_freq.pt", weights_only=True)
    rows = read_jsonl(tok / "tokenized_data.jsonl")
    masked = np.concatenate([np.asarray(r["input_ids"])[np.asarray(r["loss_mask"]) == 1] for r in rows])
    assert freq.dtype == torch.int64
    assert np.array_equal(freq.numpy(), np.bincount(masked, minlength=freq.shape[0]))
    meta = json.loads((tok / "metadata.json").read_text())
    assert meta["samples_in"] == meta["samples_out"] + sum(meta["skipped"].values())
    assert meta["samples_out"] == len(rows)


def test_shards_hold_the_hidden_states_of_the_tokenized_rows(default_run):
    run = default_run["run_dir"]
    rows = read_jsonl(run / "tokenized" / "tokenized_data.jsonl")
    plan = json.loads((run / "hidden_states" / "plan.json").read_text())
    seen = 0
    for k in range(default_run["config"]["hidden_states"]["num_shards"]):
        shard = run / "hidden_states" / f"shard_{k}"
        manifest = json.loads((shard / "manifest.json").read_text())
        start, stop = manifest["rows"]
        for i in range(start, stop):
            data = load_file(str(shard / f"hs_{i}.safetensors"))
            assert data["token_ids"].tolist() == rows[i]["input_ids"]
            assert data["hidden_states"].shape == (len(rows[i]["input_ids"]), 4, plan["hidden_size"])
            assert data["hidden_states"].dtype == torch.bfloat16
            assert torch.isfinite(data["hidden_states"].float()).all()
            seen += 1
    assert seen == len(rows)


def test_gpu_jobs_never_overlap_and_cpu_jobs_fill_the_gaps(default_run):
    # The cap is the default profile's, as for `make run`: the harness passes none.
    assert "Using workflow specific profile profiles/default" in default_run["log"]
    jobs = job_timeline(default_run["events"])
    assert {j["rule"] for j in jobs} >= GPU_RULES
    gpu = sorted((j for j in jobs if j["rule"] in GPU_RULES), key=lambda j: j["start"])
    for a, b in itertools.pairwise(gpu):
        assert a["end"] <= b["start"], f"{a['rule']} and {b['rule']} overlapped"
    # CPU jobs ran while a GPU job held the GPUs (draft_config beside regeneration,
    # build_vocab_mapping beside extraction): they do not wait for the GPU rules.
    beside = {
        c["rule"]
        for c in jobs
        if c["rule"] not in GPU_RULES | {"all"}
        for g in gpu
        if c["start"] < g["end"] and g["start"] < c["end"]
    }
    assert beside, "no CPU job ran while a GPU job was running"


def test_one_extraction_server_serves_every_shard(default_run):
    server_dir = default_run["run_dir"] / ".eaglenest" / "server"
    starts = [json.loads(line) for line in open(server_dir / "starts.log")]
    # Each start writes its command line into the server log of its spec.
    commands = [
        line for log in server_dir.glob("server-*.log") for line in open(log) if line.startswith("$ ")
    ]
    extraction = [c for c in commands if "extract_hidden_states" in c]
    # Four shard jobs, one extraction server; in all: regeneration, extraction and one server
    # per evaluation method (no speculation reuses regeneration's spec, started anew after
    # extraction replaced it).
    assert default_run["config"]["hidden_states"]["num_shards"] == 4
    assert len(extraction) == 1
    assert len(starts) == len(commands) == 6


def test_extracted_shards_match_their_manifests_byte_for_byte(default_run):
    """The manifest's checksums are taken from the bytes extraction wrote, not re-read:
    `eaglenest verify-shards --checksums` must still agree with every file."""
    from eaglenest.hidden_states.shard_check import verify_shards

    shards = sorted((default_run["run_dir"] / "hidden_states").glob("shard_*"))
    assert len(shards) == default_run["config"]["hidden_states"]["num_shards"]
    summary = verify_shards(shards, checksums=True)
    assert summary["checksums"] and summary["files"] == sum(
        len(json.loads((s / "manifest.json").read_text())["files"]) for s in shards
    )


def test_rerun_with_nothing_changed_does_nothing(default_run):
    proc = snakemake(default_run["workdir"], default_run["configfile"], "-n")
    assert planned_jobs(proc) == {}
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_changing_a_param_reruns_exactly_its_dependents(default_run):
    cfg = json.loads(json.dumps(default_run["config"]))
    cfg["evaluate"]["max_tokens"] += 8
    proc = snakemake(default_run["workdir"], write_config(default_run["workdir"], cfg, "c1.yaml"), "-n")
    assert set(planned_jobs(proc)) == {"evaluate_acceptance", "run_summary", "all"}

    cfg = json.loads(json.dumps(default_run["config"]))
    cfg["vocab"]["draft_vocab_size"] = 256
    proc = snakemake(default_run["workdir"], write_config(default_run["workdir"], cfg, "c2.yaml"), "-n")
    # A new draft vocabulary retrains, but never re-extracts hidden states or regenerates.
    assert set(planned_jobs(proc)) == {
        "build_vocab_mapping",
        "draft_config",
        "train_draft",
        "export_draft",
        "export_draft_sglang",  # the suite's cut exports to SGLang too
        "evaluate_acceptance",
        "run_summary",
        "all",
    }


def test_deleting_one_shard_rebuilds_that_shard_alone(default_run):
    shard = default_run["run_dir"] / "hidden_states" / "shard_2"
    backup = shard.with_name("shard_2.bak")
    shutil.copytree(shard, backup)
    shutil.rmtree(shard)
    try:
        # A missing intermediate does not make the final targets stale: name the shards.
        shards = [
            f"{default_run['config']['run_dir']}/hidden_states/shard_{k}"
            for k in range(default_run["config"]["hidden_states"]["num_shards"])
        ]
        proc = snakemake(default_run["workdir"], default_run["configfile"], "-n", *shards)
        jobs = planned_jobs(proc)
        assert jobs == {"extract_hidden_states": 1}
        assert "shard_2" in proc.stdout
        assert "regenerate_responses" not in jobs and "tokenize" not in jobs
    finally:
        shutil.rmtree(shard, ignore_errors=True)
        backup.rename(shard)


def test_exported_draft_states_its_contract(default_run):
    run = default_run["run_dir"]
    cfg = json.loads((run / "draft" / "config.json").read_text())
    plan = json.loads((run / "hidden_states" / "plan.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == plan["aux_layer_ids"]
    assert cfg["draft_vocab_size"] == default_run["config"]["vocab"]["draft_vocab_size"]
    for flag in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"):
        assert isinstance(cfg[flag], bool)
    assert (
        cfg["transformer_layer_config"]["max_position_embeddings"]
        >= default_run["config"]["vllm"]["max_model_len"]
    )
    weights = load_file(str(run / "draft" / "model.safetensors"))
    assert torch.equal(weights["d2t"], torch.load(run / "vocab" / "d2t.pt", weights_only=True))


def test_the_draft_is_exported_for_sglang_beside_vllm_with_every_check_passed(default_run):
    """export.engines [vllm, sglang] (the suite's cut sets it): vLLM's export is the one the
    evaluation served; SGLang's beside it, from the same tensors, trained in the form SGLang's
    forward computes, with its keys, config and forward checked."""
    run = default_run["run_dir"]
    vllm_cfg = json.loads((run / "draft" / "config.json").read_text())
    assert vllm_cfg["norm_before_residual"] is False
    assert "--no-norm-before-residual" in (run / "logs" / "train_draft.log").read_text()
    cfg = json.loads((run / "draft_sglang" / "config.json").read_text())
    record = json.loads((run / "draft_sglang" / "eaglenest_export.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    # The tiny target is a Llama: SGLang captures layer id + 1.
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [
        i - 1 for i in vllm_cfg["eagle_aux_hidden_state_layer_ids"]
    ]
    assert {name: check["ok"] for name, check in record["checks"].items()} == {
        "keys": True,
        "config": True,
        "parity": True,
    }
    sglang_weights = load_file(str(run / "draft_sglang" / "model.safetensors"))
    for key, tensor in load_file(str(run / "draft" / "model.safetensors")).items():
        assert torch.equal(sglang_weights[key], tensor), key
    summary = (run / "run_summary.csv").read_text()
    assert "sglang" in summary and "parity passed" in summary
    for folder, library in (("draft", "vllm"), ("draft_sglang", "sglang")):
        card = (run / folder / "README.md").read_text()
        assert f"library_name: {library}" in card and "position 1: " in card, folder


def test_no_server_is_left_running(default_run):
    lease = default_run["run_dir"] / ".eaglenest" / "server" / "lease.json"
    assert not lease.exists()
    for start in open(default_run["run_dir"] / ".eaglenest" / "server" / "starts.log"):
        pid = json.loads(start)["pid"]
        assert not _alive(pid), f"server pid {pid} still running"


def _alive(pid: int) -> bool:
    from eaglenest.engine.server import pid_alive

    return pid_alive(pid)


def test_report_renders_after_a_run(default_run):
    report = default_run["workdir"] / "report.html"
    snakemake(default_run["workdir"], default_run["configfile"], "--report", str(report))
    html = report.read_text(errors="replace")
    for item in (
        "vocab_coverage.png",
        "train_curves.png",
        "acceptance.csv",
        "per_position_acceptance.png",
        "benchmarks.csv",
        "acceptance_by_request.png",
        "run_summary.csv",
        "stage_times.csv",
    ):
        assert item in html, item


def test_stage_times_come_from_each_jobs_benchmark_and_match_its_job_events(default_run):
    """stage_times.csv sums what Snakemake's `benchmark:` recorded per job; each stage's wall
    time agrees with the start and end the job events give for the same jobs."""
    import pandas as pd

    table = pd.read_csv(default_run["run_dir"] / "stage_times.csv").set_index("stage")
    assert table.loc["extract_hidden_states", "jobs"] == default_run["config"]["hidden_states"]["num_shards"]
    spans: dict[str, float] = {}
    for j in job_timeline(default_run["events"]):
        if j["end"] is not None:
            spans[j["rule"]] = spans.get(j["rule"], 0.0) + j["end"] - j["start"]
    # One row per rule that ran a job, whatever rules the workflow grows: all but the summary
    # itself (which writes the table), the target rule `all` (which does no work) and the rules
    # that make a target folder shared beyond the run (no benchmark: rules/data.smk).
    assert set(table.index) == set(spans) - {"run_summary", "all", "build_tiny_target", "download_target"}
    assert GPU_RULES | {"resolve_target", "prepare_prompts", "tokenize", "train_draft"} <= set(table.index)
    for stage in GPU_RULES:  # the long ones: seconds to minutes
        assert table.loc[stage, "wall_s"] == pytest.approx(spans[stage], rel=0.1, abs=2.0), stage
    # The long stages' memory: Python with torch at least (a job of a tenth of a second is
    # sampled before it has grown, so the short ones say little).
    assert (table.loc[sorted(GPU_RULES), "peak_rss_mb"] > 200).all()


def test_the_report_states_each_gpu_stages_tokens_per_s_and_the_gpu_busy_share(default_run):
    import pandas as pd

    from eaglenest.pipeline.job_events import gpu_busy_seconds, read_events

    run = default_run["run_dir"]
    table = pd.read_csv(run / "stage_times.csv").set_index("stage")
    plan = json.loads((run / "hidden_states" / "plan.json").read_text())
    responses = [
        json.loads(line) for line in (run / "responses" / "raw_responses.jsonl").read_text().splitlines()
    ]
    assert table.loc["extract_hidden_states", "tokens"] == plan["tokens"]
    assert table.loc["regenerate_responses", "tokens"] == sum(
        len(g["completion_token_ids"]) for r in responses for g in r["generations"]
    )
    for stage in GPU_RULES:
        row = table.loc[stage]
        assert row["tokens_per_s"] == pytest.approx(row["tokens"] / row["wall_s"], rel=0.01), stage
    assert table.loc[["tokenize", "export_draft"], "tokens"].isna().all()
    summary = pd.read_csv(run / "run_summary.csv").set_index("parameter")["value"]
    share = float(summary["GPU-busy share of this invocation"].rstrip("%")) / 100
    # run_summary read its own invocation's events, up to its start: the share of the whole
    # run differs only by the last seconds.
    inv = read_events(default_run["events"])
    assert share == pytest.approx(gpu_busy_seconds(inv, inv.end) / (inv.end - inv.start), abs=0.05)


def test_transformers_backend_writes_the_same_hidden_states_as_vllm(default_run, tmp_path):
    run, cfg = default_run["run_dir"], default_run["config"]["hidden_states"]
    assert_shard_matches_transformers(
        run / "hidden_states" / "shard_0", run, run / "target", 0, cfg["num_shards"], cfg["dtype"], tmp_path / "shard_0"
    )  # fmt: skip
