# recast — two commands on a fresh machine: `make demo` (main job) and `make test` (the suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXAMPLE := pipelines/examples/gmm1d-exact-alpha2.parquet
DEMO   := artifacts/demo

.PHONY: setup test demo bench example clean

setup: $(STAMP)

# torch first, pinned to the builds this project is tested with (override: make setup TORCH="torch==X ...").
# On x86_64 torchvision (needed by open_clip) pairs with torch 2.14.1; aarch64 has CPU wheels of 2.9.1.
ifeq ($(shell uname -m),aarch64)
TORCH ?= torch==2.9.1 torchvision==0.24.1
else
TORCH ?= torch==2.14.1 torchvision==0.29.1
endif

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check $(TORCH)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[api,rewards,test]'
	touch $@

test: $(STAMP)
	$(BIN)/python -m pytest -q

# Until the toy world lands: solve W on the shipped exact gmm1d gain table, inspect it, draw Fig. 1.
demo: $(STAMP)
	$(BIN)/recast solve-w --gains $(EXAMPLE) --lambda 1,1,1 --out $(DEMO)/W-recast.safetensors
	$(BIN)/recast solve-w --gains $(EXAMPLE) --lambda 1,1,1 --steps 10 --out $(DEMO)/W-recast-T10.safetensors
	$(BIN)/recast inspect $(DEMO)/W-recast.safetensors --plot $(DEMO)/fig1.png

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_sinkhorn.py
	$(BIN)/python benchmarks/bench_rollouts.py
	$(BIN)/python -m benchmarks.bench_estimate
	$(BIN)/python benchmarks/bench_rewards.py

# Regenerate the shipped example: the exact gain table of the analytic gmm1d world (α = 2, T = 25).
example: $(STAMP)
	$(BIN)/python -m recast_cli.policy.gmm1d $(EXAMPLE)

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache
