# The two commands of the README: `make demo` (the main job) and `make test` (the test suite).
# Both run `make setup` first: idempotent, seconds when already done.
VENV ?= .venv
PY   := $(VENV)/bin/python
export HX_VENV := $(abspath $(VENV))

# SlowMo, Gossip and top-k's sparse allreduce against fp32 allreduce and allgather top-k, at 4 workers
ISSUE19 := none,slowmo4,slowmo4-m0.5-a0.5,gossip-ring,gossip-exp,topk0.01,topk0.01-sar
# What pipelining's one-step staleness costs, and what weight prediction gives back
PIPE := none,none+pipe,none+pipe+pred,global_qsgd8+pipe,global_qsgd8+pipe+pred

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
	$(PY) -m horovod_ext.bench.convergence --workers 4 --methods $(ISSUE19) --out out/convergence-4w
	$(PY) -m horovod_ext.bench.convergence --workers 4 --momentum 0.9 --lr 0.05 --methods $(ISSUE19) --out out/convergence-4w-momentum
	$(PY) -m horovod_ext.bench.convergence --workers 4 --optimizer adam --methods $(ISSUE19) --out out/convergence-4w-adam
	$(PY) -m horovod_ext.bench.convergence --momentum 0.9 --lr 0.05 --methods $(PIPE) --out out/convergence-pipe-momentum
	$(PY) -m horovod_ext.bench.convergence --optimizer adam --methods $(PIPE) --out out/convergence-pipe-adam

clean:
	rm -rf out exp .pytest_cache
