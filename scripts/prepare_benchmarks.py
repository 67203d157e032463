"""Snakemake adapter for the prepare_benchmarks stage: see eaglenest.data.benchmarks."""

from eaglenest.data.benchmarks import prepare_benchmarks_stage
from eaglenest.pipeline.workflow import run_logged

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
run_logged(
    sm.log[0],
    prepare_benchmarks_stage,
    specs=[dict(s) for s in sm.params.specs],
    seed=sm.params.seed,
    out_path=sm.output.conversations,
)
