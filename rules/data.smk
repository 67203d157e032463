# Data stages: the target (tiny default only), prompts, regenerated responses, tokenization.
# Every rule records its time and memory under {RUN}/benchmarks/ (read by run_summary and the
# timeline benchmark), except the two that make the target: their outputs outlive the run (a
# folder or the hub cache that several runs share), and a benchmark file is an output too.


if BUILD_TINY:

    rule build_tiny_target:
        input:
            corpus=tiny_target_corpus(),
            tool_corpus=tiny_target_tool_corpus(),
        output:
            # A hub-id target is published into the hub cache, as a download would leave it.
            target_source_files(),
        log:
            f"{RUN}/logs/build_tiny_target.log",
        params:
            target=TARGET,
            cache_dir=TARGET_CACHE,
            shape={
                k: v for k, v in config["target"]["build_tiny"].items() if k not in ("corpus", "tool_corpus")
            },
            corpus_digest=repository_digests([tiny_target_corpus(), *tiny_target_tool_corpus()]),
            code=code_hash("build_tiny_target", leave_out=TINY_BUILDERS_NOT_USED),
        script:
            "../scripts/build_tiny_target.py"

elif GGUF:

    rule import_gguf_target:
        input:
            gguf=GGUF_SOURCE,
        output:
            target_source_files(),
        log:
            f"{RUN}/logs/import_gguf_target.log",
        benchmark:
            f"{RUN}/benchmarks/import_gguf_target.tsv"
        params:
            dtype=GGUF.get("dtype", "bfloat16"),
            code=code_hash("import_gguf_target"),
        script:
            "../scripts/import_gguf_target.py"

elif TARGET_ON_HUB:

    rule download_target:
        output:
            # Present when the cache holds the revision: then this rule does not run. No code
            # hash among the params: an edit of eaglenest must never make Snakemake delete the
            # ref of a downloaded model to fetch it again (id, revision and cache are the path).
            target_source_files(),
        log:
            f"{RUN}/logs/download_target.log",
        params:
            target=TARGET,
            revision=config["target"]["revision"],
            cache_dir=TARGET_CACHE,
            trust_remote_code=config["target"]["trust_remote_code"],
            allow_unpinned_remote_code=config["target"]["allow_unpinned_remote_code"],
            disk_margin_gb=config["hidden_states"]["disk_margin_gb"],
        script:
            "../scripts/download_target.py"


rule resolve_target:
    input:
        target_source_files(),
    output:
        record=TARGET_RECORD,
    log:
        f"{RUN}/logs/resolve_target.log",
    benchmark:
        f"{RUN}/benchmarks/resolve_target.tsv"
    params:
        target=TARGET,
        revision=config["target"]["revision"],
        cache_dir=TARGET_CACHE,
        trust_remote_code=config["target"]["trust_remote_code"],
        allow_unpinned_remote_code=config["target"]["allow_unpinned_remote_code"],
        built_here=BUILD_TINY,
        code=code_hash("resolve_target"),
    script:
        "../scripts/resolve_target.py"


rule prepare_prompts:
    input:
        sources=prompt_source_files(),
        # Their prompts never train.
        benchmarks=BENCHMARK_FILES,
    output:
        train=f"{RUN}/prompts/prompts.jsonl",
        eval=f"{RUN}/prompts/eval_prompts.jsonl",
        stats=f"{RUN}/prompts/prompts_stats.json",
    log:
        f"{RUN}/logs/prepare_prompts.log",
    benchmark:
        f"{RUN}/benchmarks/prepare_prompts.tsv"
    params:
        sources=config["prompts"]["sources"],
        bundled_digests=repository_digests(prompt_source_files()),
        eval_samples=config["prompts"]["eval_samples"],
        seed=config["prompts"]["seed"],
        # Only what decides which prompt gets which mode: switches and sampling are regeneration's.
        modes=[{"name": m["name"], "share": m.get("share", 1.0)} for m in config["modes"]],
        # Keys sorted: the same benchmarks in another key order are no change.
        benchmarks=[dict(sorted(b.items())) for b in BENCHMARKS],
        code=code_hash("prepare_prompts"),
    script:
        "../scripts/prepare_prompts.py"


rule regenerate_responses:
    input:
        prompts=rules.prepare_prompts.output.train,
        target=rules.resolve_target.output.record,
    output:
        responses=f"{RUN}/responses/raw_responses.jsonl",
    log:
        f"{RUN}/logs/regenerate_responses.log",
    benchmark:
        f"{RUN}/benchmarks/regenerate_responses.tsv"
    resources:
        gpu=GPUS,
    params:
        run_dir=RUN,
        server=server_params(),
        reasoning_parser=config["target"]["reasoning_parser"],
        tool_call_parser=config["target"]["tool_call_parser"],
        sampling={
            k: config["regenerate"][k]
            for k in ("max_tokens", "temperature", "top_p", "n")
            if k in config["regenerate"]
        },
        modes=config["modes"],
        max_tool_rounds=config["regenerate"]["max_tool_rounds"],
        concurrency=config["regenerate"]["concurrency"],
        max_retries=config["regenerate"]["max_retries"],
        request_timeout_s=config["regenerate"]["request_timeout_s"],
        code=code_hash("regenerate_responses"),
    script:
        "../scripts/regenerate_responses.py"


rule tokenize:
    input:
        responses=rules.regenerate_responses.output.responses,
        target=rules.resolve_target.output.record,
    output:
        data=f"{RUN}/tokenized/tokenized_data.jsonl",
        freq=f"{RUN}/tokenized/token_freq.pt",
        metadata=f"{RUN}/tokenized/metadata.json",
    log:
        f"{RUN}/logs/tokenize.log",
    benchmark:
        f"{RUN}/benchmarks/tokenize.tsv"
    # Worker processes: the outputs are the same bytes whatever the count, so it is no param.
    threads: config["tokenize"]["processes"]
    params:
        run_dir=RUN,
        max_seq_len=config["tokenize"]["max_seq_len"],
        overlong=config["tokenize"]["overlong"],
        multi_turn=config["tokenize"]["multi_turn"],
        target_name=config["target"]["name"],
        code=code_hash("tokenize"),
    script:
        "../scripts/tokenize.py"
