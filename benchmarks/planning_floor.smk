# Snakemake's own planning cost for a plan of eaglenest's shape, with none of eaglenest's code:
# `config["shards"]` shard jobs like extract_hidden_states (three inputs, a directory output, log,
# benchmark, a gpu resource, params, its script) and 15 other jobs, under the same workflow
# profile (profiles/default). Only ever dry-run, by benchmarks/bench_planning.py: the script is
# named because Snakemake looks each script job's file up while planning (about 0.3 ms a job
# here), not to run it.
N = int(config["shards"])


rule all:
    input:
        expand("run/hidden_states/shard_{k}", k=range(N)),
        expand("run/other_{i}.txt", i=range(12)),


rule make_input:
    output:
        "run/{name}.in",
    log:
        "run/logs/{name}.log",
    benchmark:
        "run/benchmarks/{name}.tsv"
    script:
        "../scripts/extract_hidden_states.py"


rule other:
    input:
        "run/a.in",
    output:
        "run/other_{i}.txt",
    log:
        "run/logs/other_{i}.log",
    benchmark:
        "run/benchmarks/other_{i}.tsv"
    script:
        "../scripts/extract_hidden_states.py"


rule shard:
    input:
        "run/a.in",
        "run/b.in",
        "run/c.in",
    output:
        directory("run/hidden_states/shard_{k}"),
    log:
        "run/logs/shard_{k}.log",
    benchmark:
        "run/benchmarks/shard_{k}.tsv"
    wildcard_constraints:
        k=r"\d+",
    resources:
        gpu=8,
    params:
        num_shards=N,
        code="0" * 64,
    script:
        "../scripts/extract_hidden_states.py"
