"""Snakemake adapter for `evaluate_acceptance`: see eaglenest.evaluation.evaluate."""

from eaglenest.evaluation.evaluate import evaluate_stage
from eaglenest.pipeline.workflow import run_logged
from eaglenest.target.resolve import keep_caches_in, load_target

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
p = sm.params
keep_caches_in(p.run_dir)  # before transformers loads remote code
run_logged(
    sm.log[0],
    evaluate_stage,
    run_dir=p.run_dir,
    target=load_target(sm.input.target),
    draft_dir=sm.input.draft,
    prompts_path=sm.input.prompts,
    benchmarks_path=sm.input.benchmarks,
    metadata_path=sm.input.metadata,
    server_cfg=dict(p.server),
    k=p.k,
    max_tokens=p.max_tokens,
    concurrency=p.concurrency,
    ngram=dict(p.ngram),
    out_json=sm.output.acceptance,
    out_csv=sm.output.table,
    out_png=sm.output.plot,
    out_outputs=sm.output.outputs,
    out_sets=sm.output.sets,
    out_sets_png=sm.output.sets_plot,
    out_requests=sm.output.requests,
    out_request_png=sm.output.request_plot,
    methods=tuple(p.methods),
    # A sweep's variant evaluates its draft alone; the run's own evaluation holds no_spec's outputs.
    reference_outputs=sm.input.get("reference"),
    modes=[dict(m) for m in p.modes],
    reasoning_parser=p.reasoning_parser,
    tool_call_parser=p.tool_call_parser,
    max_tool_rounds=p.max_tool_rounds,
)
