# A sweep (config `sweep:`, eaglenest/training/sweep.py): each variant builds its own vocabulary mapping,
# draft config, draft, export and evaluation from the run's shared prompts, responses, tokenized
# rows and hidden states, so a sweep costs training and evaluation alone. The base variant (the
# config's own settings) is the run's draft; compare_variants sets them side by side.


wildcard_constraints:
    # Only the sweep's variants: any other folder name under variants/ matches no rule.
    variant="|".join(re.escape(name) for name in OWN_VARIANTS) or "(?!)",


use rule build_vocab_mapping as build_vocab_mapping_variant with:
    output:
        t2d_pt=f"{VARIANT_DIR}/vocab/t2d.pt",
        d2t_pt=f"{VARIANT_DIR}/vocab/d2t.pt",
        t2d_npy=f"{VARIANT_DIR}/vocab/t2d.npy",
        d2t_npy=f"{VARIANT_DIR}/vocab/d2t.npy",
        coverage=f"{VARIANT_DIR}/vocab/vocab_coverage.json",
        coverage_plot=f"{VARIANT_DIR}/vocab/vocab_coverage.png",
    log:
        f"{RUN}/logs/variants/{{variant}}/build_vocab_mapping.log",
    benchmark:
        f"{RUN}/benchmarks/variants/{{variant}}/build_vocab_mapping.tsv"
    params:
        draft_vocab_size=variant_setting("draft_vocab_size"),


use rule draft_config as draft_config_variant with:
    output:
        config=f"{VARIANT_DIR}/draft_config.json",
    log:
        f"{RUN}/logs/variants/{{variant}}/draft_config.log",
    benchmark:
        f"{RUN}/benchmarks/variants/{{variant}}/draft_config.tsv"
    params:
        draft_vocab_size=variant_setting("draft_vocab_size"),
        draft_layers=variant_setting("draft_layers"),
        algorithm=variant_setting("algorithm"),


use rule train_draft as train_draft_variant with:
    input:
        shards=lambda wildcards: SHARD_DIRS,
        plan=rules.plan_hidden_states.output.plan,
        data=rules.tokenize.output.data,
        prompts=rules.prepare_prompts.output.train,  # each row's source, for sweep.sources
        t2d=rules.build_vocab_mapping_variant.output.t2d_npy,
        d2t=rules.build_vocab_mapping_variant.output.d2t_npy,
        draft_config=rules.draft_config_variant.output.config,
        target=rules.resolve_target.output.record,
    output:
        checkpoint=directory(f"{VARIANT_DIR}/train/checkpoint"),
        metrics=f"{VARIANT_DIR}/train/train_metrics.json",
        curves=f"{VARIANT_DIR}/train/train_curves.png",
    log:
        f"{RUN}/logs/variants/{{variant}}/train_draft.log",
    benchmark:
        f"{RUN}/benchmarks/variants/{{variant}}/train_draft.tsv"
    params:
        hp=variant_hp,


use rule export_draft as export_draft_variant with:
    input:
        checkpoint=rules.train_draft_variant.output.checkpoint,
        t2d=rules.build_vocab_mapping_variant.output.t2d_pt,
        d2t=rules.build_vocab_mapping_variant.output.d2t_pt,
        draft_config=rules.draft_config_variant.output.config,
        target=rules.resolve_target.output.record,
        metrics=rules.train_draft_variant.output.metrics,
        metadata=rules.tokenize.output.metadata,
        coverage=rules.build_vocab_mapping_variant.output.coverage,
    output:
        draft=directory(f"{VARIANT_DIR}/draft"),
    log:
        f"{RUN}/logs/variants/{{variant}}/export_draft.log",
    benchmark:
        f"{RUN}/benchmarks/variants/{{variant}}/export_draft.tsv"
    params:
        hp=variant_hp,


use rule evaluate_acceptance as evaluate_acceptance_variant with:
    input:
        draft=rules.export_draft_variant.output.draft,
        prompts=rules.prepare_prompts.output.eval,
        benchmarks=rules.prepare_benchmarks.output.conversations,
        metadata=rules.tokenize.output.metadata,
        target=rules.resolve_target.output.record,
        # no_spec's outputs, which the variant's must equal: the run's own evaluation ran it.
        reference=rules.evaluate_acceptance.output.outputs,
    output:
        acceptance=f"{VARIANT_DIR}/eval/acceptance.json",
        outputs=f"{VARIANT_DIR}/eval/outputs.jsonl",
        table=f"{VARIANT_DIR}/eval/acceptance.csv",
        plot=f"{VARIANT_DIR}/eval/per_position_acceptance.png",
        sets=f"{VARIANT_DIR}/eval/benchmarks.csv",
        sets_plot=f"{VARIANT_DIR}/eval/acceptance_by_set.png",
        requests=f"{VARIANT_DIR}/eval/requests.csv",
        request_plot=f"{VARIANT_DIR}/eval/acceptance_by_request.png",
    log:
        f"{RUN}/logs/variants/{{variant}}/evaluate_acceptance.log",
    benchmark:
        f"{RUN}/benchmarks/variants/{{variant}}/evaluate_acceptance.tsv"
    params:
        methods=["draft"],


rule compare_variants:
    input:
        acceptance=variant_outputs(
            rules.evaluate_acceptance_variant.output.acceptance, rules.evaluate_acceptance.output.acceptance
        ),
        metrics=variant_outputs(rules.train_draft_variant.output.metrics, rules.train_draft.output.metrics),
        coverage=variant_outputs(
            rules.build_vocab_mapping_variant.output.coverage, rules.build_vocab_mapping.output.coverage
        ),
        train_benchmarks=variant_outputs(rules.train_draft_variant.benchmark, rules.train_draft.benchmark),
        reference=rules.evaluate_acceptance.output.acceptance,
    output:
        **(
            {
                "scaling": f"{RUN}/sweep/data_scaling.json",
                "scaling_plot": report(
                    f"{RUN}/sweep/data_scaling.png",
                    caption="../report/sweep_data_scaling.rst",
                    category="Sweep",
                ),
            }
            if DATA_SCALING
            else {}
        ),
        table=report(
            f"{RUN}/sweep/comparison.csv", caption="../report/sweep_comparison.rst", category="Sweep"
        ),
        plot=report(
            f"{RUN}/sweep/comparison.png", caption="../report/sweep_comparison_plot.rst", category="Sweep"
        ),
        per_position=report(
            f"{RUN}/sweep/per_position_acceptance.png",
            caption="../report/sweep_per_position.rst",
            category="Sweep",
        ),
    log:
        f"{RUN}/logs/compare_variants.log",
    benchmark:
        f"{RUN}/benchmarks/compare_variants.tsv"
    params:
        names=[v.name for v in VARIANTS],
        settings=[v.settings for v in VARIANTS],
        base=[v.is_base for v in VARIANTS],
        swept=SWEPT,
        code=code_hash("compare_variants"),
    script:
        "../scripts/compare_variants.py"
