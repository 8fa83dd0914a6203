# The README's two commands: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export VENV

# Under LOG_FORMAT=json every line `make run` writes is JSON (a log shipper reads them all):
# make does not echo the commands it runs.
ifeq ($(LOG_FORMAT),json)
.SILENT:
endif

.PHONY: help run test install install-dev lint types test-pg test-embedded compose-check bench clean
# `make` alone lists the targets below that have a `##` line, the two commands first.
.DEFAULT_GOAL := help

help:
	@awk '/^## / { doc = doc (doc ? " " : "") substr($$0, 4); next } \
	      /^[a-z][a-z-]*:/ && doc { split($$0, t, ":"); printf "make %-6s %s\n", t[1], doc } { doc = "" }' $(firstword $(MAKEFILE_LIST))

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: requirements.txt | $(BIN)/python
	$(BIN)/pip install -q -r requirements.txt
	touch $@

$(VENV)/.installed-dev: requirements.txt requirements-dev.txt | $(BIN)/python
	$(BIN)/pip install -q -r requirements-dev.txt
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

## Runs the product: web, worker, beat, demo data; prints an admin login, a token and a curl.
run: install
	scripts/run.sh

## The whole suite: lint, types, tests on PostgreSQL and Redis, then again on the embedded
## default (SQLite), but the browser tests and those that need PostgreSQL itself.
test: install-dev
	scripts/services.sh
	scripts/test-tools.sh
	$(MAKE) lint types test-pg test-embedded

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

types:
	$(BIN)/mypy .

test-pg:
	scripts/pytest.sh -p xdist -n 2 --dist loadgroup

test-embedded:
	DATABASE_URL=sqlite:///$(CURDIR)/var/test-embedded.sqlite3 scripts/pytest.sh -m "not postgres" tests --ignore=tests/browser

compose-check:
	docker-compose -f docker-compose.yml config -q

## The benchmark (bench/run.py): HTTP intake next to raw SQL (pgbench). BENCH_ARGS=--quick for a short run.
bench: install-dev
	scripts/services.sh
	$(BIN)/python -m bench.run $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var staticfiles
