# The README's two commands: `make demo` and `make test`. Both build .venv from nothing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_WORKERS ?= 2
# the extras .venv is built with (CI adds ray); they apply when the venv is built
EXTRAS ?= engine,dev
PARALLEL := $(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist worksteal
# bytecode is written whatever the environment says: every pytest process (each xdist worker, the timing
# tier, a test's own child) then reads pytest's rewritten test modules and the compiled sources the first
# one left in __pycache__, instead of spending ~6 s of CPU redoing them
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# exactly this torch, in the project's own resolve: an open range would pull a multi-GB CUDA build.
	# --no-compile: pip would byte-compile all ~21,000 modules installed (~60 s of one core); Python
	# compiles the ~3,000 a run imports as it first imports them, and writes them for the next process
	$(PY) -m pip install -q --no-compile torch==2.13.0 -e '.[$(EXTRAS)]'
	touch $(STAMP)

.PHONY: install demo lint test test-all test-fast
install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/slobench demo

lint: $(STAMP)
	$(VENV)/bin/ruff check slobench reference_engine tests benchmarks
	$(VENV)/bin/mypy slobench reference_engine

# all but the nightly tests, on xdist workers; then the timing tier alone (tests/conftest.py says why)
test: lint
	$(PARALLEL) -m "not timing and not nightly"
	$(PY) -m pytest -q -ra -m "timing and not nightly"

# everything, the nightly end-to-end tests included
test-all: lint
	$(PARALLEL) -m "not timing"
	$(PY) -m pytest -q -ra -m timing

# the unit tier: no servers, processes, kernels, browser or wall-time assertions (which a busy machine
# fails), torch made unimportable (tests/conftest.py)
test-fast: $(STAMP)
	SLOBENCH_WITHOUT_TORCH=1 $(PY) -m pytest -q \
	  -m "not integration and not kernels and not browser and not slow and not timing"
