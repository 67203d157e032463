# Training with speculators' EAGLE-3 trainer, and the export vLLM serves directly.


rule train_draft:
    input:
        shards=lambda wildcards: SHARD_DIRS,  # a function: a list here makes planning quadratic
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
        hp=config["train"],
        gpus=GPUS,
        device=config["vllm"]["device"],
        code=code_hash("train", "contracts", "hidden_states", "shard_check", "draft_config", "target"),
    script:
        "../scripts/train_draft.py"


rule export_draft:
    input:
        checkpoint=rules.train_draft.output.checkpoint,
        t2d=rules.build_vocab_mapping.output.t2d_pt,
        d2t=rules.build_vocab_mapping.output.d2t_pt,
        draft_config=rules.draft_config.output.config,
        target=rules.resolve_target.output.record,
    output:
        draft=directory(f"{RUN}/draft"),
    log:
        f"{RUN}/logs/export_draft.log",
    benchmark:
        f"{RUN}/benchmarks/export_draft.tsv"
    params:
        max_model_len=config["vllm"]["max_model_len"],
        code=code_hash("export", "target"),
    script:
        "../scripts/export_draft.py"
