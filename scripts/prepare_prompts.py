"""Snakemake adapter for the prepare_prompts stage: see eaglenest.prompts."""

import logging

from eaglenest.prompts import prepare_prompts

logging.basicConfig(
    filename=snakemake.log[0],  # noqa: F821 (injected by Snakemake)
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)
try:
    prepare_prompts(
        sources=list(snakemake.params.sources),  # noqa: F821
        eval_samples=snakemake.params.eval_samples,  # noqa: F821
        seed=snakemake.params.seed,  # noqa: F821
        train_path=snakemake.output.train,  # noqa: F821
        eval_path=snakemake.output.eval,  # noqa: F821
        stats_path=snakemake.output.stats,  # noqa: F821
    )
except Exception:
    logging.exception("prepare_prompts failed")
    raise
