"""Snakemake adapter for `build_tiny_target`: see eaglenest.tiny_target."""

from eaglenest.tiny_target import build_stage
from eaglenest.workflow import run_logged

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
p = sm.params
run_logged(
    sm.log[0],
    build_stage,
    target=p.target,
    cache_dir=p.cache_dir,
    corpus=sm.input.corpus,
    shape=dict(p.shape),
)
