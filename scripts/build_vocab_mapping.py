"""Snakemake adapter for the vocab_mapping rule: all logic lives in eaglenest.vocab."""

import logging

from eaglenest.target import load_target
from eaglenest.vocab import MappingPaths, build_vocab_mapping

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
logging.basicConfig(
    filename=sm.log[0],
    level=logging.INFO,
    force=True,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)
out = sm.output
try:
    build_vocab_mapping(
        sm.input.token_freq,
        int(sm.params.draft_vocab_size),
        MappingPaths(
            out.t2d_pt,
            out.d2t_pt,
            out.t2d_npy,
            out.d2t_npy,
            coverage_json=out.coverage,
            coverage_plot=out.coverage_plot,
        ),
        target_vocab_size=load_target(sm.input.target).shape["vocab_size"],
        always_keep_ids=[int(i) for i in (sm.params.always_keep_ids or ())],
    )
except Exception:
    logging.exception("vocab mapping failed")  # the traceback belongs in the rule's log
    raise
