# Two commands do all the set-up themselves: `make run` (the default pipeline) and `make test`.
# Each creates .venv first when it is missing.
SNAKEMAKE := .venv/bin/snakemake

.PHONY: env run dry-run report test test-fast lint docs clean
env:
	envs/setup.sh

run: env
	$(SNAKEMAKE) --cores all

dry-run: env
	$(SNAKEMAKE) -n

report: env
	$(SNAKEMAKE) --report report.html

# The whole suite (CI's command): the unit tests first, stopping at the first failure (a broken
# change fails in two minutes), then the engine tests and the end-to-end runs. -rs names the
# reason of every skip; --durations lists the slowest, for CI's time budget.
test: env
	HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q -rs -p no:cacheprovider -n auto --dist worksteal -x tests -m "not engine and not slurm"
	HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q -rs -p no:cacheprovider --durations=25 tests -m "engine or slurm"

# Every unit test, no engine and no end-to-end run, one pytest worker per core (pytest-xdist).
# worksteal: an idle worker takes queued tests from a busy one, so the suite's few long tests
# (real Snakemake runs, hung-server bounds) do not leave one core idle at the end.
test-fast: env
	HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q -rs -p no:cacheprovider -n auto --dist worksteal tests -m "not engine and not slurm"

# The docs' generated pages current and the site built strictly (broken links and anchors, pages
# missing from the nav), lint, format, the package's layer contract (.importlinter) and workflow
# checks (CI runs them before the tests), and a dry run of every shipped config, and of the
# examples (config/examples/) and the real-model study overlay over config/smollm2.yaml.
lint: env
	.venv/bin/python docs/generate.py --check
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir .mkdocs-site && rm -rf .mkdocs-site
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/snakefmt --check Snakefile rules
	.venv/bin/lint-imports --no-cache
	.venv/bin/python .ci/lint-workflow
	@for c in config/*.yaml; do \
	  HF_HUB_OFFLINE=1 $(SNAKEMAKE) -n --configfile $$c > .snakemake-dry-run.log 2>&1 \
	    || { cat .snakemake-dry-run.log; echo "dry run failed: $$c"; exit 1; }; \
	  echo "dry run ok: $$c ($$(grep -E '^total' .snakemake-dry-run.log | tail -1 | awk '{print $$2}') jobs)"; \
	done; rm -f .snakemake-dry-run.log
	@for o in config/examples/*.yaml benchmarks/configs/smollm2_study.yaml; do \
	  HF_HUB_OFFLINE=1 $(SNAKEMAKE) -n -q --configfile config/smollm2.yaml $$o > /dev/null \
	    || { echo "dry run failed: config/smollm2.yaml + $$o"; exit 1; }; \
	  echo "dry run ok: config/smollm2.yaml + $$o"; \
	done

# The docs' generated pages (the config reference, the results) and the site, in site/.
docs: env
	.venv/bin/python docs/generate.py
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict

clean:
	rm -rf results .snakemake report.html site
