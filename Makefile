# One command to set up and run the demo, one to set up and run the tests.
# Both create .venv when it is missing: torch==2.13.0 (the CPU wheel) first, then graphfed with the dev, flower and
# trackers extras.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# one pytest worker per core and one more (see test), at most 8: a worker peaked at 3.7-4.0 GB of memory here
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n + 1 < 8 ? n + 1 : 8 )))
# the project's real datasets, beside the clone (graphfed's own default is the user's data folder)
export GRAPHFED_DATA ?= $(abspath ../shared/data)

.PHONY: demo test lint docs bench clean setup

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev,docs,flower,trackers]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/graphfed compare configs/demo_fl60.yaml --methods panacea,pfedhn,fedavg --seeds 1 --out runs/demo

# The installed-wheel check (tools/check_wheel.py: fresh venvs at the newest and lowest versions the bounds allow,
# mostly network and disk) runs beside the tests, which take every core (pytest-xdist, one worker more than the
# cores: the Flower deployment tests mostly wait on their processes; tests/conftest.py deals the slow tests out to the
# workers, and worksteal moves queued tests to a worker that runs dry). The tests marked kernel_paths
# (what must hold on every CPU's kernels: two computations of one value, the portable golden runs) run again with MKL
# held to its AVX2 path, the one AMD CPUs take: a bit-for-bit claim that holds only on this CPU's kernels fails here.
test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks tools docs
	$(BIN)/lint-imports
	$(BIN)/python tools/check_wheel.py > $(VENV)/wheel-check.log 2>&1 & wheel=$$!; \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal; tests=$$?; \
	MKL_ENABLE_INSTRUCTIONS=AVX2 $(BIN)/python -m pytest -n 2 -m kernel_paths; capped=$$?; \
	wait $$wheel; checked=$$?; cat $(VENV)/wheel-check.log; \
	[ $$tests -eq 0 ] && [ $$capped -eq 0 ] && [ $$checked -eq 0 ]

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks tools docs
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python benchmarks/sim_throughput.py
	$(BIN)/python benchmarks/startup.py
	$(BIN)/graphfed bench paper --out benchmarks/results/paper
	$(BIN)/python benchmarks/aggregation_family.py
	$(BIN)/python benchmarks/flower_overhead.py
	$(BIN)/graphfed bench flha --out benchmarks/results/flha --in-process
	$(BIN)/python benchmarks/flha.py refine
	$(BIN)/python benchmarks/flha.py report
	$(BIN)/graphfed bench robustness --out benchmarks/results/robustness --in-process
	$(BIN)/python benchmarks/robustness.py

# The documentation site into site/ (warnings are errors; tests/test_docs.py builds it too and runs its runnable
# blocks). The two variables silence a notice the MkDocs plugins print on every build about MkDocs 2.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) runs site .pytest_cache .ruff_cache
