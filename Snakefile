# eaglenest: train an EAGLE-3 draft head for a served target model.
# `snakemake --cores all` builds what is missing; `snakemake -n` shows the plan.
from snakemake.utils import min_version

# The code relies on Snakemake 9's logger-plugin job events and profile behaviour (eaglenest/pipeline/job_events.py, profiles/).
min_version("9.0")


# The embedded default, only when no --configfile is given: a user's config file is the whole
# config (the schema fills defaults), never merged over the stand-in's (docs/guide/pipeline.md#configs-one-file-is-the-whole-config).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/vocab.smk"
include: "rules/hidden_states.smk"
include: "rules/train.smk"
include: "rules/evaluate.smk"
include: "rules/sweep.smk"


rule all:
    input:
        acceptance=f"{RUN}/eval/acceptance.json",
        draft=f"{RUN}/draft",
        draft_sglang=[f"{RUN}/draft_sglang"] if SGLANG_EXPORT else [],
        coverage=f"{RUN}/vocab/vocab_coverage.json",
        summary=f"{RUN}/run_summary.csv",
        # With a sweep: every variant, side by side (rules/sweep.smk).
        sweep=[f"{RUN}/sweep/comparison.csv"] if VARIANTS else [],


onstart:
    start_run()


onsuccess:
    release_server()


onerror:
    release_server()
