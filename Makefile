# Two commands do all the set-up themselves: `make run` (the default pipeline) and `make test`.
# Each creates .venv first when it is missing.
SNAKEMAKE := .venv/bin/snakemake

.PHONY: env run dry-run report test lint clean
env:
	envs/setup.sh

run: env
	$(SNAKEMAKE) --cores all

dry-run: env
	$(SNAKEMAKE) -n

report: env
	$(SNAKEMAKE) --report report.html

test: env
	HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests

lint: env
	$(SNAKEMAKE) --lint

clean:
	rm -rf results .snakemake report.html
