"""Snakemake adapter for the prepare_prompts stage: see eaglenest.data.prompts."""

from eaglenest.data.benchmarks import benchmark_prompts
from eaglenest.data.prompts import prepare_stage
from eaglenest.pipeline.workflow import run_logged

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
p = sm.params
run_logged(
    sm.log[0],
    prepare_stage,
    sources=list(p.sources),
    eval_samples=p.eval_samples,
    seed=p.seed,
    modes=[dict(m) for m in p.modes],
    benchmark_prompts=benchmark_prompts([dict(b) for b in p.benchmarks]),
    train_path=sm.output.train,
    eval_path=sm.output.eval,
    stats_path=sm.output.stats,
)
