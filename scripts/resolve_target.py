"""Snakemake adapter for `resolve_target`: see eaglenest.target.resolve."""

from eaglenest.pipeline.workflow import run_logged
from eaglenest.target.resolve import resolve_stage

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
p = sm.params
run_logged(
    sm.log[0],
    resolve_stage,
    name=p.target,
    revision=p.revision,
    cache_dir=p.cache_dir,
    trust_remote_code=p.trust_remote_code,
    allow_unpinned_remote_code=p.allow_unpinned_remote_code,
    built_here=p.built_here,
    out_record=sm.output.record,
)
