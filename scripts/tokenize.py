"""Snakemake adapter for the tokenize rule: all logic lives in eaglenest.data.tokenize."""

from eaglenest.data.tokenize import tokenize_stage
from eaglenest.pipeline.workflow import run_logged
from eaglenest.target.resolve import keep_caches_in, load_target

sm = snakemake  # noqa: F821 -- injected by Snakemake's `script:` directive
p = sm.params
keep_caches_in(p.run_dir)  # before transformers loads remote code
target = load_target(sm.input.target)
run_logged(
    sm.log[0],
    tokenize_stage,
    responses_path=sm.input.responses,
    target_dir=target.path,
    max_seq_len=int(p.max_seq_len),
    overlong=str(p.overlong),
    out_data=sm.output.data,
    out_freq=sm.output.freq,
    out_metadata=sm.output.metadata,
    target_name=str(p.target_name or ""),
    target_revision=target.commit,
    trust_remote_code=target.trust_remote_code,
    multi_turn=str(p.multi_turn),
    processes=sm.threads,
)
