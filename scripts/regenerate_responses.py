"""Snakemake adapter for `regenerate_responses`: see eaglenest.data.regenerate."""

from eaglenest.data.regenerate import regenerate_stage
from eaglenest.pipeline.workflow import run_logged
from eaglenest.target.resolve import load_target

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
p = sm.params
run_logged(
    sm.log[0],
    regenerate_stage,
    run_dir=p.run_dir,
    target=load_target(sm.input.target).path,
    server_cfg=dict(p.server),
    reasoning_parser=p.reasoning_parser,
    tool_call_parser=p.tool_call_parser,
    prompts_path=sm.input.prompts,
    out_path=sm.output.responses,
    sampling=dict(p.sampling),
    modes=[dict(m) for m in p.modes],
    max_tool_rounds=p.max_tool_rounds,
    concurrency=p.concurrency,
    max_retries=p.max_retries,
    request_timeout_s=p.request_timeout_s,
)
