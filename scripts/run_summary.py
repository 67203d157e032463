"""Snakemake adapter for `run_summary`: see eaglenest.report.summary."""

from eaglenest.pipeline.workflow import run_logged
from eaglenest.report.summary import summary_stage
from eaglenest.target.resolve import load_target

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
run_logged(
    sm.log[0],
    summary_stage,
    target=load_target(sm.input.target),
    lr=sm.params.lr,
    acceptance_path=sm.input.acceptance,
    metrics_path=sm.input.metrics,
    coverage_path=sm.input.coverage,
    plan_path=sm.input.plan,
    metadata_path=sm.input.metadata,
    benchmark_files=sm.params.stage_benchmarks,
    responses_path=sm.input.responses,
    sglang_export_path=f"{sm.input.sglang_export[0]}/eaglenest_export.json"
    if sm.input.sglang_export
    else None,
    out_summary=sm.output.summary,
    out_stage_times=sm.output.stage_times,
)
