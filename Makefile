# The two commands of the README: `make demo` and `make test`; both set themselves up.
VENV := .venv
PYTHON := $(VENV)/bin/python
RUNS := runs

.PHONY: setup demo test lint clean

setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh

# pytest as a console script, not `python -m pytest`: the latter puts the repository root on
# sys.path, where the folder compression/ would shadow the standard library's `compression`.
# The slowest tests are listed at the end: CI has 30 minutes, and this shows where they go.
test: setup lint
	@$(VENV)/bin/pytest -q -p no:cacheprovider --durations=40 $(PYTEST_ARGS)

# Part of `make test` (and so of CI): lint findings and unformatted files fail the run.
lint: setup
	@$(VENV)/bin/ruff check --quiet .
	@$(VENV)/bin/ruff format --check --quiet .

clean:
	rm -rf $(RUNS) .pytest_cache .hypothesis
