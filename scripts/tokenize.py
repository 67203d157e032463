"""Snakemake adapter for the tokenize rule: all logic lives in eaglenest.tokenize."""

from eaglenest.tokenize import tokenize_responses
from eaglenest.workflow import run_logged

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
p = sm.params
run_logged(sm.log[0], tokenize_responses, sm.input.responses, p.target, int(p.max_seq_len),
           str(p.overlong), sm.output.data, sm.output.freq, sm.output.metadata,
           target_name=str(getattr(p, "target_name", "") or ""),
           target_revision=getattr(p, "target_revision", None) or None)
