# Set-up and test entry points. Every target installs what it needs, idempotently.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV        := $(CURDIR)/.venv
BIN         := $(VENV)/bin
PYTHON      := $(BIN)/python
STAMP       := $(VENV)/.requirements.sha256
# The venv's interpreter: Debian's own python3 where there is one (built with PGO and LTO, it runs Ansible's
# controller about a sixth faster than a python3 built from source without them), else the first on PATH.
BASE_PYTHON ?= $(firstword $(wildcard /usr/bin/python3) python3)
LAB         := tests/lab/lab
COLLECTIONS := $(CURDIR)/build/collections
SANITY_TREE := $(CURDIR)/build/sanity/ansible_collections/llmops/inference
APT_PACKAGES := debootstrap systemd-container iproute2 util-linux gcc make openssh-client psmisc python3-venv
DEMO_LAB    ?= demo
DEMO_HOSTS  ?= 3
BENCH_LAB   ?= bench
E2E_WORKERS ?= 3
E2E_ARGS    ?=
UNIT_WORKERS ?= 4
MOLECULE_WORKERS ?= 4
MOLECULE_LAB ?= mol

export ANSIBLE_COLLECTIONS_PATH := $(COLLECTIONS)
export PATH := $(BIN):$(PATH)

.PHONY: help deps venv collection-link lint ruff ansible-lint sanity units e2e e2e-long molecule test demo demo-down \
        lab-wheels lab-up lab-down lab-image bench docs build clean

help: ## List the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

deps: ## Install the Debian packages the lab and the tests need (apt, only what is missing)
	@[ "$$(id -u)" = 0 ] || { echo "make deps: needs root (apt-get, and the lab boots containers)" >&2; exit 1; }
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

venv: $(STAMP) ## Create .venv with the pinned controller and test tools

$(STAMP): requirements.txt
	@command -v $(BASE_PYTHON) >/dev/null || { echo "python3 is needed (apt-get install python3 python3-venv)" >&2; exit 1; }
	@[ -x $(PYTHON) ] || $(BASE_PYTHON) -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -r requirements.txt
	sha256sum requirements.txt > $(STAMP)

collection-link: ## Make the checkout importable as ansible_collections.llmops.inference
	@mkdir -p $(COLLECTIONS)/ansible_collections/llmops
	@# unchanged when right: the parts that run side by side each ask for it
	@[ "$$(readlink $(COLLECTIONS)/ansible_collections/llmops/inference)" = $(CURDIR) ] \
	  || ln -sfn $(CURDIR) $(COLLECTIONS)/ansible_collections/llmops/inference

ruff: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

ansible-lint: venv collection-link
	$(BIN)/ansible-lint --offline --profile production

lint: ruff ansible-lint ## ruff and ansible-lint (production profile)

sanity: venv ## ansible-test sanity from an ansible_collections/llmops/inference tree
	rm -rf $(SANITY_TREE) && mkdir -p $(SANITY_TREE)
	git ls-files -z --cached --others --exclude-standard | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C $(SANITY_TREE)
	cd $(SANITY_TREE) && git init -q && git add -A  # ansible-test lists files with git; build/ is ignored here
	$(PYTHON) tests/sanity/bootstrap_pip.py
	cd $(SANITY_TREE) && $(BIN)/ansible-test sanity --color no --python 3.11 --requirements

lab-wheels: venv ## Download the pinned sglang and nvidia-ml-py wheels into the lab's cache (the units read the real wheel)
	PYTHONPATH=tests/lab $(PYTHON) -c 'from labctl.image import ensure_wheels; ensure_wheels()'

units: venv collection-link lab-wheels ## Unit tests (plugins, the lab's parts, the performance page's generator), UNIT_WORKERS side by side
	$(PYTHON) -m pytest -q -p no:cacheprovider -n $(UNIT_WORKERS) tests/unit tests/lab/tests tests/bench/tests -m 'not lab'

e2e: deps venv collection-link ## End-to-end tests on lab hosts (root); E2E_WORKERS labs side by side
	# No reruns: a test that fails, fails the part (-ra in pyproject.toml names it, and any rerun). Each worker
	# boots one lab of its own with 4 GPUs per host (what the GPU-placement tests need, so no extra lab boots) and
	# takes whole files (their tests share module fixtures), heaviest first: tests/e2e/conftest.py orders files by
	# tests/e2e/durations.json and --no-loadscope-reorder keeps that order (xdist would otherwise order files by
	# their number of tests). Record new durations with: make e2e E2E_ARGS=--record-durations (tests/README.md).
	LLMOPS_LAB_GPUS=4 $(PYTHON) -m pytest -q -p no:cacheprovider --durations 15 \
	  -n $(E2E_WORKERS) --dist loadfile --no-loadscope-reorder $(E2E_ARGS) \
	  tests/e2e tests/lab/tests -m 'lab and not bench and not long'

e2e-long: deps venv collection-link ## The lab acceptance runs too long for make test (a whole sweep with its proof), one lab
	LLMOPS_LAB_GPUS=4 $(PYTHON) -m pytest -q -p no:cacheprovider -m 'lab and long' tests/e2e

molecule: deps venv collection-link ## Molecule scenarios on lab hosts (root); MOLECULE_WORKERS side by side
	# `molecule test -s NAME` for each scenario, side by side, each on hosts of its own of one lab that
	# molecule_all.py boots once and takes down at the end, also after a failure.
	cd extensions && $(PYTHON) molecule_all.py --workers $(MOLECULE_WORKERS) --shared-lab $(MOLECULE_LAB) \
	  --molecule $(BIN)/molecule

# lint, sanity, units, docs and ee run side by side (none keeps two cores busy alone); e2e and molecule one after
# the other (each does). What the side-by-side parts share is installed before they start.
TEST_SIDE_BY_SIDE := lint sanity units docs ee
TEST_ONE_BY_ONE   := e2e molecule

test: deps venv collection-link lab-wheels docs-venv ## Everything CI runs, every part even after one failed; each part's result and duration at the end
	$(PYTHON) tests/run_parts.py --make "$(MAKE) -f $(firstword $(MAKEFILE_LIST))" --logs $(CURDIR)/build/test-logs \
	  --side-by-side $(TEST_SIDE_BY_SIDE) --one-by-one $(TEST_ONE_BY_ONE)

lab-image: deps venv ## Build (or reuse) the cached lab rootfs
	$(LAB) image

lab-up: deps venv ## Boot a lab: make lab-up LAB_NAME=lab LAB_HOSTS=3
	$(LAB) up --name $${LAB_NAME:-lab} --hosts $${LAB_HOSTS:-3} --gpus $${LAB_GPUS:-2}

lab-down: venv ## Remove a lab: make lab-down LAB_NAME=lab
	$(LAB) down --name $${LAB_NAME:-lab}

demo: deps venv collection-link ## Boot a 3-host lab, deploy to it, print a probe report
	$(LAB) up --name $(DEMO_LAB) --hosts $(DEMO_HOSTS) --gpus 2
	ANSIBLE_CONFIG=docs/examples/ansible.cfg $(BIN)/ansible-playbook \
	  -i /run/llmops-lab/$(DEMO_LAB)/inventory.yml -i tests/lab/inventory playbooks/deploy.yml
	ANSIBLE_CONFIG=docs/examples/ansible.cfg $(BIN)/ansible-playbook \
	  -i /run/llmops-lab/$(DEMO_LAB)/inventory.yml -i tests/lab/inventory playbooks/fleet_probe.yml
	@echo "The demo lab stays up for you to explore: ssh, tests/lab/lab exec --name $(DEMO_LAB) $(DEMO_LAB)1 -- ..."
	@echo "Remove it with: make demo-down"

demo-down: venv ## Remove the demo lab
	$(LAB) down --name $(DEMO_LAB)

# What `make bench` measures; a part of them with LLMOPS_BENCH_RUN=<run> adds to that run (at the same commit).
BENCH_TESTS ?= tests/e2e/test_bench.py tests/e2e/test_bench_sweep.py tests/e2e/test_bench_fleet.py tests/e2e/test_bench_reference.py
bench: deps venv collection-link ## Benchmarks on a 12-host lab (5 runs, about 3 h): raw data to docs/performance/, then docs/performance.md
	@run=$${LLMOPS_BENCH_RUN:-$$(date -u +%Y%m%dT%H%M%SZ)}; status=0; \
	LLMOPS_BENCH_RUN=$$run LLMOPS_LAB_NAME=$(BENCH_LAB) LLMOPS_LAB_HOSTS=12 \
	  $(PYTHON) -m pytest -q -s -p no:cacheprovider --durations 0 -m bench $(BENCH_TESTS) || status=$$?; \
	$(PYTHON) tests/bench/write_performance.py --run $$run; exit $$status

build: venv ## Build the collection tarball
	$(BIN)/ansible-galaxy collection build --force

.PHONY: gpu-check
gpu-check: ## GPU conformance kit on this host's real GPUs (docs/gpu_conformance.md): JSON + summary under build/gpu-check/
	@out=$${GPU_CHECK_OUT:-$(CURDIR)/build/gpu-check/$$(date -u +%Y%m%dT%H%M%SZ)}; \
	python=python3; [ ! -x $(PYTHON) ] || python=$(PYTHON); \
	echo "gpu-check: results go to $$out"; \
	$$python tests/gpu/gpu_kit.py --out "$$out"

clean: ## Remove build outputs (not the venv or the lab cache)
	rm -rf build tests/output llmops-inference-*.tar.gz

include docs/docs.mk
