"""Snakemake adapter for `import_gguf_target`: see eaglenest.gguf_target."""

from eaglenest.gguf_target import import_stage
from eaglenest.workflow import run_logged

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
run_logged(sm.log[0], import_stage, gguf=dict(sm.params.gguf), target=sm.params.target)
