# ragrig: `make demo` installs everything and runs v1 and v2 on the embedded default slice;
# `make test` runs the default test suite.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
TORCH_VERSION ?= 2.13.0
STAMP := outputs/.setup-done

.PHONY: setup demo test test-slow test-crash test-all bench data clean

# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	$(PIP) install --quiet "torch==$(TORCH_VERSION)"
	$(PIP) install --quiet -e ".[dev]"
	@mkdir -p outputs && touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PYTHON) run.py +version=v1
	$(PYTHON) run.py +version=v2

test: setup
	$(PYTHON) -m pytest -q

test-slow: setup
	$(PYTHON) -m pytest -q -m slow

# Runs killed with SIGKILL mid-build and rerun; CI runs this target too.
test-crash: setup
	$(PYTHON) -m pytest -q -m crash

test-all: setup
	$(PYTHON) -m pytest -q -m "slow or scale or distributed or crash or not slow"

# Renders/extracts the local corpora (man pages, torch docstrings) into the cache and exports
# them as JSONL under data/corpora/, so a first run does not pay for it.
data: setup
	$(PYTHON) -m rag.data --out data/corpora

bench: setup
	$(PYTHON) -m experiments.bench --out outputs/bench

clean:
	rm -rf outputs/runs outputs/multirun outputs/bench .pytest_cache
