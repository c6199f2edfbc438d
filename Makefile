# The two commands the README opens with:
#   make run    the main job on the embedded default (CPU, minutes)
#   make test   install everything from this repository's files and run the checks CI runs
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUN_DIR ?= runs/local

.PHONY: run embedded test test-fast check-wheel install install-dev system-deps sandbox-deps lint format bench clean vllm-env test-warm images test-cluster cluster-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[all]'

install-dev: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'

system-deps:
	bash scripts/install-system-deps.sh

# What the local sandbox needs (bubblewrap, setpriv, Debian's python3 with pytest): make run's share.
sandbox-deps:
	bash scripts/install-system-deps.sh --sandbox-only

run: install sandbox-deps
	$(BIN)/gagar run --out $(RUN_DIR)

# Rebuild the shipped pre-RL policy of the embedded default (src/gagar/data/embedded-policy, its recipe
# and SHA256SUMS) from scratch, bit-exactly: after changing task generation, noise or demonstrations.
embedded: install
	$(BIN)/gagar policy embedded

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: install-dev system-deps lint
	$(BIN)/pytest

# The unit tiers only: lint, then every test not marked slow (end-to-end runs) or cluster.
test-fast: install-dev system-deps lint
	$(BIN)/pytest -m "not slow and not cluster" -q

WHEEL_VENV ?= .work/wheel-venv

# Build the wheel, install it in a fresh venv and compile both targets from outside the checkout.
check-wheel: $(BIN)/python
	rm -rf dist $(WHEEL_VENV) && $(BIN)/pip wheel --no-deps -q -w dist .
	$(PYTHON) -m venv $(WHEEL_VENV) && $(WHEEL_VENV)/bin/pip install -q "$$(ls dist/gagar-*.whl)[kfp,argo]"
	cd / && $(abspath $(WHEEL_VENV))/bin/gagar pipeline compile --out $(abspath $(WHEEL_VENV))/rl.yaml
	cd / && $(abspath $(WHEEL_VENV))/bin/gagar pipeline compile --target argo --out $(abspath $(WHEEL_VENV))/argo.yaml

VLLM_VENV ?= .venv-vllm

# vLLM's CPU build in an environment of its own (about 3.4 GiB, 6 minutes), for warm inference.
vllm-env:
	bash scripts/install-vllm-env.sh $(VLLM_VENV)

# The warm-inference tests against a real vLLM server, including a 2-step RL loop through it.
test-warm: install-dev system-deps vllm-env
	GAGAR_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(BIN)/pytest tests/warm

# Container engine, debootstrap, the Kubernetes build tools, etcd (apt): what make images and make test-cluster use.
cluster-deps:
	bash scripts/install-system-deps.sh --cluster

# Every stage image (podman, a local debootstrap base; CPU variants of the CUDA ones), each run once as uid 1000
# with no network (docs/cluster.md).
images: cluster-deps
	bash scripts/build-images.sh

# A one-node Kubernetes 1.20 from Debian's source (binaries cached), then the cluster tests, then the cluster down.
test-cluster: install-dev system-deps cluster-deps
	PYTHON=$(abspath $(BIN))/python bash scripts/test-cluster.sh

format: install-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install-dev
	$(BIN)/python benchmarks/advantage.py

clean:
	rm -rf $(VENV) node_modules .pytest_cache .ruff_cache .hypothesis runs .work
