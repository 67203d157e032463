"""Snakemake adapter for `compare_variants`: see eaglenest.report.variant_comparison."""

from eaglenest.pipeline.workflow import run_logged
from eaglenest.report.variant_comparison import compare_stage

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
p = sm.params
run_logged(
    sm.log[0],
    compare_stage,
    names=list(p.names),
    settings=[dict(s) for s in p.settings],
    base=list(p.base),
    acceptance_files=list(sm.input.acceptance),
    metrics_files=list(sm.input.metrics),
    coverage_files=list(sm.input.coverage),
    train_benchmarks=list(sm.input.train_benchmarks),
    reference_acceptance=sm.input.reference,
    keys=list(p.swept),
    out_csv=sm.output.table,
    out_plot=sm.output.plot,
    out_per_position=sm.output.per_position,
    out_scaling=sm.output.get("scaling"),
    out_scaling_plot=sm.output.get("scaling_plot"),
)
