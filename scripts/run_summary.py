"""Snakemake adapter for `run_summary`: see eaglenest.summary."""

from eaglenest.summary import summarize_run
from eaglenest.target import load_target
from eaglenest.workflow import run_logged

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
run_logged(
    sm.log[0],
    summarize_run,
    target=load_target(sm.input.target),
    lr=sm.params.lr,
    acceptance_path=sm.input.acceptance,
    metrics_path=sm.input.metrics,
    coverage_path=sm.input.coverage,
    plan_path=sm.input.plan,
    metadata_path=sm.input.metadata,
    out_csv=sm.output.summary,
)
