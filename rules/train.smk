# Training with speculators' EAGLE-3 trainer, the export vLLM serves directly and, with
# export.engines naming sglang, the one SGLang loads. Offline, it
# reads the stored shards; online and hybrid, it extracts from the run's server as it trains.


rule train_draft:
    input:
        shards=lambda wildcards: SHARD_DIRS,  # a function: a list here makes planning quadratic
        plan=rules.plan_hidden_states.output.plan,
        data=rules.tokenize.output.data,
        t2d=rules.build_vocab_mapping.output.t2d_npy,
        d2t=rules.build_vocab_mapping.output.d2t_npy,
        draft_config=rules.draft_config.output.config,
        target=rules.resolve_target.output.record,
    output:
        checkpoint=directory(f"{RUN}/train/checkpoint"),
        metrics=f"{RUN}/train/train_metrics.json",
        curves=report(
            f"{RUN}/train/train_curves.png", caption="../report/train_curves.rst", category="Training"
        ),
    log:
        f"{RUN}/logs/train_draft.log",
    benchmark:
        f"{RUN}/benchmarks/train_draft.tsv"
    resources:
        gpu=GPUS,
    params:
        run_dir=RUN,
        hp=train_settings(config),
        gpus=GPUS,
        device=config["vllm"]["device"],
        # The mode is a training param: switching it reruns training and what follows, never
        # regeneration or tokenization (one draft per run folder, as in every mode).
        hs_mode=HS_MODE,
        hs_dtype=config["hidden_states"]["dtype"],
        # Offline training starts no server: its settings must not retrain it.
        server=server_params() if HS_MODE != "offline" else None,
        server_gpus=config["hidden_states"]["server_gpus"] if HS_MODE != "offline" else None,
        shared_gpu_server_memory=(
            config["hidden_states"]["shared_gpu_server_memory"] if HS_MODE != "offline" else None
        ),
        code=train_code(),
    script:
        "../scripts/train_draft.py"


rule export_draft:
    input:
        checkpoint=rules.train_draft.output.checkpoint,
        t2d=rules.build_vocab_mapping.output.t2d_pt,
        d2t=rules.build_vocab_mapping.output.d2t_pt,
        draft_config=rules.draft_config.output.config,
        target=rules.resolve_target.output.record,
        # What the folder's model card states.
        metrics=rules.train_draft.output.metrics,
        metadata=rules.tokenize.output.metadata,
        coverage=rules.build_vocab_mapping.output.coverage,
    output:
        draft=directory(f"{RUN}/draft"),
    log:
        f"{RUN}/logs/export_draft.log",
    benchmark:
        f"{RUN}/benchmarks/export_draft.tsv"
    params:
        max_model_len=config["vllm"]["max_model_len"],
        hp=train_settings(config),
        k=config["evaluate"]["num_speculative_tokens"],
        code=code_hash("export_draft"),
    script:
        "../scripts/export_draft.py"


if SGLANG_EXPORT:

    rule export_draft_sglang:
        input:
            draft=rules.export_draft.output.draft,
            target=rules.resolve_target.output.record,
            metrics=rules.train_draft.output.metrics,
            metadata=rules.tokenize.output.metadata,
            coverage=rules.build_vocab_mapping.output.coverage,
        output:
            draft=directory(f"{RUN}/draft_sglang"),
        log:
            f"{RUN}/logs/export_draft_sglang.log",
        benchmark:
            f"{RUN}/benchmarks/export_draft_sglang.tsv"
        params:
            hp=train_settings(config),
            k=config["evaluate"]["num_speculative_tokens"],
            code=code_hash("export_draft_sglang"),
        script:
            "../scripts/export_draft_sglang.py"
