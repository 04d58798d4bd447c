# The README's two commands: `make demo` and `make test`. Both build .venv from nothing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_WORKERS ?= 2

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# exactly this torch first: an open range would pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[engine,dev]'
	touch $(STAMP)

.PHONY: install demo test test-fast lint
install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/slobench demo

test: $(STAMP)
	$(VENV)/bin/ruff check slobench reference_engine tests benchmarks
	$(VENV)/bin/mypy slobench reference_engine
	# two xdist workers for all but the timing tier, which then runs alone (tests/conftest.py says why)
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist worksteal -m "not timing"
	$(PY) -m pytest -q -ra -m timing

# the unit tier: no servers, processes, kernels or browser, torch made unimportable (tests/conftest.py)
test-fast: $(STAMP)
	SLOBENCH_WITHOUT_TORCH=1 $(PY) -m pytest -q -m "not integration and not kernels and not browser and not slow"
