"""Snakemake adapter for `build_tiny_target`: see eaglenest.tiny_target."""
from eaglenest.tiny_target import build_tiny_target
from eaglenest.workflow import run_logged

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
run_logged(sm.log[0], build_tiny_target, sm.params.target, [sm.input.corpus],
           **dict(sm.params.shape))
