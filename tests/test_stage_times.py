"""stage_times.csv: each stage's time and memory from Snakemake's own `benchmark:` files."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd

from eaglenest.report.summary import read_benchmark, summarize_stage_times

SNAKEFILE = """\
rule all:
    input: expand("out/shard_{k}", k=[0, 1]), "out/merged"

rule extract:
    output: "out/shard_{k}"
    benchmark: "bench/extract/shard_{k}.tsv"
    shell: "sleep 1; touch {output}"

rule merge:
    input: expand("out/shard_{k}", k=[0, 1])
    output: "out/merged"
    benchmark: "bench/merge.tsv"
    shell: "touch {output}"
"""


def test_stage_times_sum_each_stages_benchmark_files(tmp_path):
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2"], cwd=tmp_path, check=True, capture_output=True
    )
    files = sorted(str(p) for p in (tmp_path / "bench").rglob("*.tsv"))
    assert len(files) == 3
    out = tmp_path / "stage_times.csv"
    summarize_stage_times(benchmark_files=files, out_csv=out, tokens={"extract": (5000, "prefill tokens")})
    table = pd.read_csv(out).set_index("stage")
    assert list(table.columns) == [
        "jobs", "wall_s", "longest_job_s", "cpu_s", "peak_rss_mb", "tokens", "tokens_are", "tokens_per_s",
    ]  # fmt: skip
    assert table.loc["extract", "tokens_per_s"] == round(5000 / table.loc["extract", "wall_s"], 1)
    assert pd.isna(table.loc["merge", "tokens"])
    assert table.loc["extract", "jobs"] == 2 and table.loc["merge", "jobs"] == 1
    shards = [read_benchmark(f)["s"] for f in files if "extract" in f]
    assert min(shards) >= 1.0  # each shard slept a second
    assert table.loc["extract", "wall_s"] == round(sum(shards), 1)
    assert table.loc["extract", "longest_job_s"] == round(max(shards), 1)
    assert table.loc["merge", "wall_s"] < 1.0
    assert not list(tmp_path.glob("stage_times.csv.*"))  # written under a temporary name
