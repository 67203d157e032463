# The draft vocabulary and the draft's config: CPU rules that run while GPU rules do.


rule build_vocab_mapping:
    input:
        token_freq=rules.tokenize.output.freq,
        target=rules.resolve_target.output.record,
        metadata=rules.tokenize.output.metadata,
    output:
        t2d_pt=f"{RUN}/vocab/t2d.pt",
        d2t_pt=f"{RUN}/vocab/d2t.pt",
        t2d_npy=f"{RUN}/vocab/t2d.npy",
        d2t_npy=f"{RUN}/vocab/d2t.npy",
        coverage=f"{RUN}/vocab/vocab_coverage.json",
        coverage_plot=report(
            f"{RUN}/vocab/vocab_coverage.png", caption="../report/vocab_coverage.rst", category="Vocabulary"
        ),
    log:
        f"{RUN}/logs/build_vocab_mapping.log",
    benchmark:
        f"{RUN}/benchmarks/build_vocab_mapping.tsv"
    params:
        draft_vocab_size=config["vocab"]["draft_vocab_size"],
        always_keep_ids=config["vocab"]["always_keep_ids"],
        code=code_hash("build_vocab_mapping"),
    script:
        "../scripts/build_vocab_mapping.py"


rule draft_config:
    input:
        target=rules.resolve_target.output.record,
        token_freq=mask_token_counts,
    output:
        config=f"{RUN}/draft_config.json",
    log:
        f"{RUN}/logs/draft_config.log",
    benchmark:
        f"{RUN}/benchmarks/draft_config.tsv"
    params:
        aux_layer_ids=config["hidden_states"]["aux_layer_ids"],
        draft_vocab_size=config["vocab"]["draft_vocab_size"],
        draft_layers=train_settings(config)["draft_layers"],
        max_model_len=config["vllm"]["max_model_len"],
        sglang_export=SGLANG_EXPORT,
        algorithm=config["draft"]["algorithm"],
        mask_token_id=config["draft"]["mask_token_id"],
        code=code_hash("draft_config"),
    script:
        "../scripts/draft_config.py"
