"""Snakemake adapter for `build_tiny_target`: see eaglenest.target.build."""

from eaglenest.pipeline.workflow import run_logged
from eaglenest.target.build import build_stage

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
p = sm.params
run_logged(
    sm.log[0],
    build_stage,
    target=p.target,
    cache_dir=p.cache_dir,
    corpus=sm.input.corpus,
    tool_corpus=list(sm.input.tool_corpus),
    shape=dict(p.shape),
)
