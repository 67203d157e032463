"""Snakemake adapter for the vocab_mapping rule: all logic lives in eaglenest.data.vocab."""

from eaglenest.data.vocab import mapping_stage
from eaglenest.pipeline.workflow import run_logged
from eaglenest.target.resolve import load_target

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
out = sm.output
run_logged(
    sm.log[0],
    mapping_stage,
    token_freq=sm.input.token_freq,
    draft_vocab_size=int(sm.params.draft_vocab_size),
    target=load_target(sm.input.target),
    always_keep_ids=[int(i) for i in (sm.params.always_keep_ids or ())],
    t2d_pt=out.t2d_pt,
    d2t_pt=out.d2t_pt,
    t2d_npy=out.t2d_npy,
    d2t_npy=out.d2t_npy,
    coverage_json=out.coverage,
    coverage_plot=out.coverage_plot,
    metadata=sm.input.metadata,
)
