# The two commands of the README: `make demo` (the main job) and `make test` (the test suite).
# Both run `make setup` first: idempotent, seconds when already done.
VENV ?= .venv
PY   := $(VENV)/bin/python
export HX_VENV := $(abspath $(VENV))

.PHONY: setup test test-fast demo bench-convergence clean

setup:
	@bash scripts/setup.sh

test: setup
	@bash scripts/test.sh

demo: setup
	@bash scripts/demo.sh

bench-convergence: setup
	$(PY) -m horovod_ext.bench.convergence --out out/convergence
	$(PY) -m horovod_ext.bench.convergence --momentum 0.9 --lr 0.05 --out out/convergence-momentum
	$(PY) -m horovod_ext.bench.convergence --optimizer adam --out out/convergence-adam

clean:
	rm -rf out exp .pytest_cache
