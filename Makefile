# recast — two commands on a fresh machine: `make demo` (main job) and `make test` (the suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXAMPLE := pipelines/examples/gmm1d-exact-alpha2.parquet
DEMO   := artifacts/demo

.PHONY: setup test demo bench example gpu-preflight device-wheels fetch clean all judges side side-vllm

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
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[api,rewards,test,wandb]'
	touch $@

# ImageReward and HPSv3 pin transformers 4.x: their published packages live in side package
# sets (docs/rewards.md); the adapters are checked against them in a process of their own.
SIDE := .side
SIDE_IR := $(SIDE)/ir/.installed
SIDE_HPS := $(SIDE)/hps/.installed

$(SIDE_IR): $(STAMP)
	$(BIN)/pip install --quiet --disable-pip-version-check --target $(SIDE)/ir --no-deps image-reward==1.5 \
	    transformers==4.45.2 tokenizers==0.20.3 huggingface_hub==0.36.0 timm==0.6.13 fairscale==0.4.13 \
	    datasets==3.6.0 diffusers==0.31.0 openai-clip ftfy wcwidth dill multiprocess xxhash 'setuptools<81'
	touch $@

$(SIDE_HPS): $(SIDE_IR)
	$(BIN)/pip install --quiet --disable-pip-version-check --target $(SIDE)/hps --no-deps hpsv3==1.0.0 \
	    trl==0.11.4 peft==0.13.2 omegaconf antlr4-python3-runtime==4.9.3 fire termcolor tensorboard \
	    tensorboard-data-server absl-py markdown werkzeug grpcio protobuf
	touch $@

# vLLM, which serves the unifiedreward judge, pins its own torch: a virtual environment of its own
# (about 10 GB with its CUDA wheels; built by `make judges` when a judge's server has to be started).
VLLM_VERSION ?= 0.11.0
SIDE_VLLM := $(SIDE)/vllm/.installed
VLLM ?= $(SIDE)/vllm/bin/vllm
$(SIDE_VLLM):
	$(PYTHON) -m venv $(SIDE)/vllm
	$(SIDE)/vllm/bin/pip install --quiet --disable-pip-version-check vllm==$(VLLM_VERSION)
	touch $@

# The suite in TEST_JOBS processes (pytest-xdist; a test file's tests stay in one process): the number of
# cores, at most 4 (each process holds its own torch). The package checks of the side package sets run
# inside it (tests/rewards/test_side_environment.py).
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
test: $(STAMP) $(SIDE_HPS)
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile

# The toy world end to end: stage 1 (renderer positives → gain curves on the shipped toy model
# → W → Fig. 1), four steps of stage 2 (recast train with that W), then W on the exact gain
# table of the analytic gmm1d world.
demo: $(STAMP)
	$(BIN)/recast sample-positive --setting toy --source renderer --n 4 --out $(DEMO)/positives
	$(BIN)/recast estimate --policy toy --rewards toy_color,toy_shape,toy_sharpness --positives $(DEMO)/positives \
	    --steps 10 --n 4 --k 2 --p 8 --out $(DEMO)/gains.parquet
	$(BIN)/recast solve-w --gains $(DEMO)/gains.parquet --lambda 1,1,1 --skip-clean 1 --out $(DEMO)/W-recast.safetensors
	$(BIN)/recast inspect $(DEMO)/W-recast.safetensors --plot $(DEMO)/fig1.png
	$(BIN)/recast plot --gains $(DEMO)/gains.parquet --d-curves --out $(DEMO)/D.png
	rm -rf $(DEMO)/run
	$(BIN)/recast train --setting toy --weights $(DEMO)/W-recast.safetensors --out $(DEMO)/run --max-steps 4 --save-every 2
	$(BIN)/recast solve-w --gains $(EXAMPLE) --lambda 1,1,1 --out $(DEMO)/gmm1d-W.safetensors
	$(BIN)/recast solve-w --gains $(EXAMPLE) --lambda 1,1,1 --steps 10 --out $(DEMO)/gmm1d-W-T10.safetensors
	$(BIN)/recast sample --run $(DEMO)/run --prompt "a red circle on a white background" \
	    --prompt "a blue square on a black background" --prompt "a yellow triangle on a white background" \
	    --n 4 --grid --out $(DEMO)/samples
	@echo "demo: the figures are $(DEMO)/fig1.png (W, as in the paper's Fig. 1) and $(DEMO)/D.png (each reward's"
	@echo "      discriminability curve); the trained policy's samples are $(DEMO)/samples/grid.png (a row per prompt);"
	@echo "      the run is $(DEMO)/run (recast inspect $(DEMO)/run). Four steps train little: its reward may go down."

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_sinkhorn.py
	$(BIN)/python benchmarks/bench_rollouts.py
	$(BIN)/python -m benchmarks.bench_estimate
	$(BIN)/python benchmarks/bench_rewards.py
	$(BIN)/python -m benchmarks.bench_train
	$(BIN)/python benchmarks/bench_threads.py --threads 1,2 --repeats 3

# The GPU check (benchmarks/gpu_preflight.sh): tests/test_offload.py on this machine's devices (the
# same images and losses with the text encoders offloaded as without), then `recast preflight` of
# both paper settings on its GPU: SD3.5-Medium's architecture with random weights and its rewards'
# networks, one batch of each reward, one estimate batch, three train steps (eager, compiled, and eager
# with the text encoders offloaded the other way) and one evaluate chunk each (README, "Before you
# spend GPU hours"): a table each on stdout, preflight.json in $(OUT)/ocr and $(OUT)/geneval when
# OUT is set, else in artifacts/preflight/, with versions.txt, offload.txt and log.txt beside them.
# Every step runs even if one fails; the target fails if any did.
PREFLIGHT := $(if $(OUT),$(OUT),artifacts/preflight)
gpu-preflight: $(STAMP)
	PY=$(BIN)/python OUT='$(PREFLIGHT)' bash benchmarks/gpu_preflight.sh

# The same check on a machine with a CUDA torch but no .venv and no network (docs/gpu.md): download
# here the wheels benchmarks/device-wheels.txt pins (cp312, manylinux x86_64) into .whl/, carry that
# folder there and run `WHEELS=.whl PY=python3 OUT=... bash benchmarks/gpu_preflight.sh`.
DEVICE_PLATFORMS := $(foreach p,manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
	manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1,--platform $(p)_x86_64)
device-wheels: $(STAMP)
	$(BIN)/python -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
	    --python-version 3.12 --implementation cp $(DEVICE_PLATFORMS) -d .whl -r benchmarks/device-wheels.txt

# Download what a setting needs (docs/fetch.md): its Hub models into the HF cache, its pinned prompt
# files into its data paths; the size first, resumable. FETCH_FLAGS passes flags (--dry-run).
fetch: $(STAMP)
	$(BIN)/recast fetch $(SETTING) $(FETCH_FLAGS)

# Regenerate the shipped example: the exact gain table of the analytic gmm1d world (α = 2, T = 25).
example: $(STAMP)
	$(BIN)/python -m recast_cli.policy.gmm1d $(EXAMPLE)

# A setting's whole study (pipelines/$(SETTING).toml [study]): warmup → positives → estimate →
# solve-w per budget × mode → train × seeds → evaluate → report, as a Make graph over the
# artifact files in artifacts/$(SETTING)/ (an interrupted study resumes). JOBS runs that many
# recipes at once; with JOBS > 1 each gets one CPU thread unless OMP_NUM_THREADS says otherwise
# (processes that share the cores; a single process keeps torch's default, docs/benchmarks.md).
SETTING ?= toy
JOBS ?= 1
STUDY := artifacts/$(SETTING)
ifneq ($(JOBS),1)
STUDY_THREADS := OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1}
endif
# GPUS=0,1,2,3 with JOBS=4: each recipe takes a free GPU of the list for as long as it runs
# (recast_cli/study/slots.py; GPUS=0+1,2+3: two GPUs per job). Unset: every job sees every GPU.
ifneq ($(GPUS),)
STUDY_RECAST := RECAST="$(BIN)/python -m recast_cli.study.slots --dir $(STUDY)/.slots --gpus $(GPUS) -- $(BIN)/recast"
endif
# LAUNCH trains each run across several GPUs, e.g.
# LAUNCH="$(BIN)/accelerate launch --config_file pipelines/accelerate/ddp.yaml --num_processes 8" (docs/train.md);
# with GPUS=0+1+2+3,4+5+6+7 and --num_processes 4, two runs at once, four GPUs each.
ifneq ($(LAUNCH),)
STUDY_LAUNCH := RECAST_TRAIN="$(if $(GPUS),$(BIN)/python -m recast_cli.study.slots --dir $(STUDY)/.slots --gpus $(GPUS) -- )$(LAUNCH) -m recast_cli train"
endif
all: $(STAMP)
	mkdir -p $(STUDY)
	$(BIN)/recast study-makefile --setting $(SETTING) --root $(STUDY) --recast $(BIN)/recast > $(STUDY)/study.mk.tmp
	mv $(STUDY)/study.mk.tmp $(STUDY)/study.mk
	$(STUDY_THREADS) $(MAKE) -f $(STUDY)/study.mk -j $(JOBS) all $(STUDY_RECAST) $(STUDY_LAUNCH)

# The held-out judges of a study that `make all` ran (its evaluations score the training rewards only, so
# training never waits on a judge): every evaluation gets [evaluate] judges, scored on its saved images,
# then the report again. The judges run with the side package sets of hpsv3 and imagereward ahead of
# .venv's (built first; docs/rewards.md): JUDGES_ENV= runs them in .venv alone. A served judge
# (unifiedreward) whose server does not answer on this host gets one for as long as the judges run:
# `recast serve-judges` starts $(VLLM) (.side/vllm is built first when that is the one) with
# VLLM_SHARE of the GPU's memory, logs in artifacts/SETTING/servers/, and stops it afterwards.
JUDGES_ENV ?= PYTHONPATH=$(SIDE)/hps:$(SIDE)/ir
VLLM_SHARE ?= 0.3
judges: $(STAMP) $(SIDE_HPS)
	$(BIN)/recast study-makefile --setting $(SETTING) --root $(STUDY) --recast $(BIN)/recast > $(STUDY)/study.mk.tmp
	mv $(STUDY)/study.mk.tmp $(STUDY)/study.mk
	if [ -n "$$($(BIN)/recast serve-judges --setting $(SETTING) --needs)" ] && [ "$(VLLM)" = "$(SIDE)/vllm/bin/vllm" ]; \
	    then $(MAKE) $(SIDE_VLLM); fi
	$(JUDGES_ENV) $(BIN)/recast serve-judges --setting $(SETTING) --vllm $(VLLM) --share $(VLLM_SHARE) \
	    --logs $(STUDY)/servers -- $(MAKE) -f $(STUDY)/study.mk -j $(JOBS) judges $(STUDY_RECAST)

# The side package sets of the judges whose packages pin transformers 4.x (docs/rewards.md);
# side-vllm: the environment of the vLLM server of unifiedreward.
side: $(SIDE_HPS)
side-vllm: $(SIDE_VLLM)

clean:
	rm -rf $(VENV) $(SIDE) $(DEMO) .pytest_cache
