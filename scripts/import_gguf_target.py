"""Snakemake adapter for `import_gguf_target`: see eaglenest.target.gguf."""

from pathlib import Path

from eaglenest.pipeline.workflow import run_logged
from eaglenest.target.gguf import import_gguf

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
# The folder is the one its outputs name (target.path); the file is its input.
run_logged(sm.log[0], import_gguf, sm.input.gguf, Path(sm.output[0]).parent, dtype=sm.params.dtype)
