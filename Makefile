# Every target installs what it needs first: on a fresh clone `make demo` and
# `make test` are each the only command to run.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test chromium demo dev up status down migrate bench-writeback bench-workqueue bench-chaos bench-polling bench-statements lock clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing nexus-pipelines into $(VENV) (pinned by constraints.txt)..."
	@$(BIN)/python -m pip install -q --upgrade pip
	@PYTHONWARNINGS=ignore $(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,bench]'
	@touch $(STAMP)

# Two workers, each with its own embedded Postgres and emulator; a file's tests stay on one
# worker, so module fixtures are shared as they are in a plain `pytest` run.
test: $(STAMP) chromium
	$(BIN)/python -m pytest -n 2 --dist loadfile

# The page tests drive Debian's Chromium through Playwright (`playwright install` cannot
# download browsers here), so `make test` installs it when it is missing.
chromium:
	@command -v chromium >/dev/null || { echo "installing Debian's chromium for the page tests..."; \
		apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }

demo: $(STAMP)
	$(BIN)/nexus-pipelines demo

# The Dagster UI on :3000 and the ticket pages (Board, Ticket Detail, Attention) on :3100
# (`nexus-pipelines local dev`); Ctrl-C stops both.
PAGES_PORT ?= 3100
DAGSTER_PORT ?= 3000
dev: $(STAMP)
	$(BIN)/nexus-pipelines local dev --pages-port $(PAGES_PORT) --dagster-port $(DAGSTER_PORT)

up: $(STAMP)
	$(BIN)/nexus-pipelines local up

status: $(STAMP)
	$(BIN)/nexus-pipelines local status

down: $(STAMP)
	$(BIN)/nexus-pipelines local down

migrate: $(STAMP)
	. .nexus_local/env && $(BIN)/nexus-pipelines migrate

bench-writeback: $(STAMP)
	$(BIN)/python bench/writeback.py --rows 100000 --latency-ms 200

bench-workqueue: $(STAMP)
	$(BIN)/python bench/workqueue.py --items 20000 --workers 4

bench-chaos: $(STAMP)
	$(BIN)/python bench/workqueue_chaos.py

bench-polling: $(STAMP)
	$(BIN)/python bench/polling.py --provider all

bench-statements: $(STAMP)
	$(BIN)/python bench/statements.py --provider gitlab

# Refresh the pins after changing dependencies in pyproject.toml.
lock: $(STAMP)
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^nexus-pipelines' > constraints.txt

clean:
	-$(BIN)/nexus-pipelines local down
	rm -rf $(VENV) .nexus_local .pytest_cache
