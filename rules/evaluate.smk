# Acceptance in vLLM on the held-out prompts and the configured benchmarks, in every mode: no
# speculation, the model-free baselines (evaluate.baselines), the untrained and the trained draft.


rule prepare_benchmarks:
    input:
        BENCHMARK_FILES,
    output:
        conversations=f"{RUN}/prompts/benchmarks.jsonl",
    log:
        f"{RUN}/logs/prepare_benchmarks.log",
    benchmark:
        f"{RUN}/benchmarks/prepare_benchmarks.tsv"
    params:
        specs=BENCHMARKS,
        seed=config["prompts"]["seed"],
        code=code_hash("prepare_benchmarks"),
    script:
        "../scripts/prepare_benchmarks.py"


rule evaluate_acceptance:
    input:
        draft=rules.export_draft.output.draft,
        prompts=rules.prepare_prompts.output.eval,
        benchmarks=rules.prepare_benchmarks.output.conversations,
        metadata=rules.tokenize.output.metadata,
        target=rules.resolve_target.output.record,
    output:
        acceptance=f"{RUN}/eval/acceptance.json",
        outputs=f"{RUN}/eval/outputs.jsonl",
        table=report(f"{RUN}/eval/acceptance.csv", caption="../report/acceptance.rst", category="Acceptance"),
        plot=report(
            f"{RUN}/eval/per_position_acceptance.png",
            caption="../report/per_position_acceptance.rst",
            category="Acceptance",
        ),
        sets=report(f"{RUN}/eval/benchmarks.csv", caption="../report/benchmarks.rst", category="Acceptance"),
        sets_plot=report(
            f"{RUN}/eval/acceptance_by_set.png",
            caption="../report/acceptance_by_set.rst",
            category="Acceptance",
        ),
        requests=f"{RUN}/eval/requests.csv",
        request_plot=report(
            f"{RUN}/eval/acceptance_by_request.png",
            caption="../report/acceptance_by_request.rst",
            category="Acceptance",
        ),
    log:
        f"{RUN}/logs/evaluate_acceptance.log",
    benchmark:
        f"{RUN}/benchmarks/evaluate_acceptance.tsv"
    resources:
        gpu=GPUS,
    params:
        run_dir=RUN,
        server=server_params(),
        methods=list(EVAL_METHODS),
        k=config["evaluate"]["num_speculative_tokens"],
        max_tokens=config["evaluate"]["max_tokens"],
        concurrency=config["evaluate"]["concurrency"],
        ngram=config["evaluate"]["ngram"],
        modes=config["modes"],
        # The servers parse as regeneration's do; held-out tool loops are replayed up to the cap.
        reasoning_parser=config["target"]["reasoning_parser"],
        tool_call_parser=config["target"]["tool_call_parser"],
        max_tool_rounds=config["regenerate"]["max_tool_rounds"],
        # vLLM loads the DFlash mend by its plugin name; no stage imports it.
        code=code_hash("evaluate_acceptance", also=("engine.vllm_cpu_dflash",)),
    script:
        "../scripts/evaluate_acceptance.py"


rule run_summary:
    input:
        acceptance=rules.evaluate_acceptance.output.acceptance,
        metrics=rules.train_draft.output.metrics,
        coverage=rules.build_vocab_mapping.output.coverage,
        plan=rules.plan_hidden_states.output.plan,
        metadata=rules.tokenize.output.metadata,
        responses=rules.regenerate_responses.output.responses,
        target=rules.resolve_target.output.record,
        sglang_export=[f"{RUN}/draft_sglang"] if SGLANG_EXPORT else [],
        # What Snakemake's `benchmark:` recorded for each job of the run (time, memory), less
        # the extraction shards' files: train_draft (an input) waits for every shard already.
        benchmarks=run_benchmark_files(shards=False),
    output:
        summary=report(f"{RUN}/run_summary.csv", caption="../report/run_summary.rst", category="Run"),
        stage_times=report(f"{RUN}/stage_times.csv", caption="../report/stage_times.rst", category="Run"),
    log:
        f"{RUN}/logs/run_summary.log",
    benchmark:
        f"{RUN}/benchmarks/run_summary.tsv"
    params:
        # Every job's file, the shards' too, in stage order: the stage times table's rows.
        stage_benchmarks=run_benchmark_files(),
        lr=train_settings(config)["lr"],
        code=code_hash("run_summary"),
    script:
        "../scripts/run_summary.py"
