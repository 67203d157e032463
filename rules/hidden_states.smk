# Hidden-state extraction: a storage plan (layers, each mode's peak bytes, disk check), then, in
# offline mode, one job per shard (online and hybrid: train_draft extracts, see rules/train.smk).
# The draft's config is not an input: changing the draft vocabulary must not re-extract.
# Shards are ordinary outputs,
# so deleting one rebuilds it alone; all GPU jobs share one leased vLLM server. A rerun (more
# prompts: every shard's rows move) takes each sample extracted before under the same settings
# from the run's sample store and asks the server only for the new ones.


rule plan_hidden_states:
    input:
        metadata=rules.tokenize.output.metadata,
        data=rules.tokenize.output.data,
        target=rules.resolve_target.output.record,
    output:
        plan=f"{RUN}/hidden_states/plan.json",
    log:
        f"{RUN}/logs/plan_hidden_states.log",
    benchmark:
        f"{RUN}/benchmarks/plan_hidden_states.tsv"
    params:
        aux_layer_ids=config["hidden_states"]["aux_layer_ids"],
        num_shards=NUM_SHARDS,
        dtype=config["hidden_states"]["dtype"],
        mode=HS_MODE,
        data_loaders=data_loaders(config),
        disk_margin_gb=config["hidden_states"]["disk_margin_gb"],
        run_dir=RUN,
        # Offline, the samples already in the run's sample store need no new disk: the plan
        # looks them up under the extraction's settings (eaglenest.hidden_states.store).
        extraction=(
            {"backend": config["hidden_states"]["backend"], "server": server_params()}
            if HS_MODE == "offline"
            else None
        ),
        code=code_hash("plan_hidden_states"),
    script:
        "../scripts/plan_hidden_states.py"


rule extract_hidden_states:
    input:
        data=rules.tokenize.output.data,
        plan=rules.plan_hidden_states.output.plan,
        target=rules.resolve_target.output.record,
    output:
        shard=directory(f"{RUN}/hidden_states/shard_{{k}}"),
    log:
        f"{RUN}/logs/extract_hidden_states/shard_{{k}}.log",
    benchmark:
        f"{RUN}/benchmarks/extract_hidden_states/shard_{{k}}.tsv"
    wildcard_constraints:
        k=r"\d+",
    resources:
        gpu=GPUS,
    params:
        run_dir=RUN,
        num_shards=NUM_SHARDS,
        dtype=config["hidden_states"]["dtype"],
        backend=config["hidden_states"]["backend"],
        concurrency=config["hidden_states"]["concurrency"],
        server=server_params(),
        # The server loads the CPU KV connector by its module path: no import names it.
        code=code_hash("extract_hidden_states", also=("engine.cpu_connector",)),
    script:
        "../scripts/extract_hidden_states.py"
