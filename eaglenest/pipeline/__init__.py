"""Workflow glue the Snakefile, the rule scripts and `eaglenest plan` share: logging, code
hashes, the run's config, its lock and signals, Snakemake's job events. Free of torch: the
Snakefile imports it on every `snakemake -n`."""
