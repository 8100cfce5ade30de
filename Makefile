# jobset-inplace developer entry points. Everything is idempotent and starts from a bare
# machine (Go and Python 3.11 installed); upstream binaries are cached in $(JSI_CACHE_DIR).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
JSI_CACHE_DIR ?= $(HOME)/.cache/jobset-inplace
export JSI_CACHE_DIR
# Kubernetes minor for the local cluster and tests (testbed/versions.env; empty: its default,
# 1.37). `make test K8S=1.35` runs everything on the older supported release.
K8S ?=
export K8S
NODES ?= 4
REAL_NODES ?= 2
PYTEST_ARGS ?=
BENCH_ARGS ?=
# make release: where the images are pushed and the plugin archive published (the release
# workflow's defaults; docs/releasing.md)
VERSION ?=
REGISTRY ?= ghcr.io/jobset-inplace
PLUGIN_BASE_URL ?= https://github.com/jobset-inplace/jobset-inplace/releases/download/v$(VERSION)
RUNBOOK_BASE_URL ?= https://github.com/jobset-inplace/jobset-inplace/blob/v$(VERSION)/docs/runbooks.md

.PHONY: help venv binaries images lint test unit integration e2e e2e-kind soak cluster-up cluster-down cluster-install \
        cluster-status demo bench bench-pages bench-spares bench-realnode bench-realnode-deaths bench-crashes release plugin-archive clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed ## Python virtualenv with the package and dev tools

binaries: ## build pinned upstream binaries from Go modules (cached, idempotent)
	bash testbed/build-binaries.sh

images: venv ## the agent and controller images, offline and reproducible (docs/images.md); EXAMPLES=1: the examples' too
	$(PY) -m testbed.images $(if $(EXAMPLES),--examples)

lint: venv ## ruff + mypy + the layer contracts (import-linter, [tool.importlinter]) + shellcheck + actionlint on .github/workflows
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/shellcheck -x $$(git grep -lE '^#!(/usr/bin/env |/bin/)(ba)?sh$$' -- ':!*.md')
	$(PY) -c 'from testbed.versions import ensure_binaries; ensure_binaries("actionlint")' >&2
	"$$($(PY) -c 'from testbed.versions import binaries; print(binaries().actionlint)')"

unit: venv ## pure unit tests (no cluster)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

integration: venv binaries ## tests against a real etcd + kube-apiserver
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

e2e: venv binaries ## e2e suite on the local cluster (JSI_KUBECONFIG=...: another cluster, docs/testing.md)
	$(PY) -m pytest e2e $(PYTEST_ARGS)

test: venv binaries lint ## everything: lint, unit, integration, e2e on the local cluster
	$(PY) -m pytest tests e2e $(PYTEST_ARGS)

cluster-up: venv binaries ## local cluster: control plane, NODES kwok + REAL_NODES kubelet nodes, JobSet, Kueue
	$(PY) -m testbed up --nodes $(NODES) --real-nodes $(REAL_NODES)

cluster-down: venv ## stop and delete the local cluster
	$(PY) -m testbed down

cluster-install: venv ## install jobset-inplace in the local cluster like a user (images, kubectl apply -k)
	$(PY) -m testbed install

cluster-status: venv ## is the local cluster up, and where are its kubeconfig and logs
	$(PY) -m testbed status

e2e-kind: venv ## e2e suite on a kind cluster, every image built here (Docker installed if none answers; docs/testing.md#kind)
	bash testbed/kind/run.sh $(PYTEST_ARGS)

demo: venv binaries ## hybrid recovery on the local cluster: train, inject a failure, print the timeline
	$(PY) -m testbed.demo

$(VENV)/.bench: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $@

bench-pages: venv ## rewrite the generated figures of README.md and docs/benchmarks.md from their result files in docs/bench/
	$(PY) -m bench.pages

bench-spares: venv binaries $(VENV)/.bench ## node death -> training again: hot spares vs no spares vs upstream InPlaceRestart, kwok (BENCH_ARGS="--size 100 --deaths 3")
	$(PY) -m bench.spares $(BENCH_ARGS)

bench-realnode: venv binaries ## crash -> every trainer running on the real nodes: jobset-inplace vs upstream InPlaceRestart vs stock (BENCH_ARGS="--reps 5")
	$(PY) -m bench.realnode $(BENCH_ARGS)

bench-realnode-deaths: venv binaries ## a node's death -> every trainer running on 3 real nodes: hot spare vs none vs upstream InPlaceRestart + out-of-service taint (BENCH_ARGS="--reps 3")
	$(PY) -m bench.realnode_deaths $(BENCH_ARGS)

bench-crashes: venv binaries ## every crash of a real PyTorch trainer in every restart scope, on the real nodes: recovered once, one step, nothing old left (BENCH_ARGS="--reps 2")
	$(PY) -m bench.crash_matrix $(BENCH_ARGS)

soak: venv binaries $(VENV)/.bench ## a gang on the local cluster for 60 min, a failure every 3 min (crash, silent node, hang, device fault, drain): goodput and badput (BENCH_ARGS="--minutes 15")
	$(PY) -m bench.soak $(BENCH_ARGS)

bench: venv binaries $(VENV)/.bench ## scale benchmark, hybrid vs stock (not in make test; BENCH_ARGS="--sizes 100 --reps 2" for a quick run)
	$(PY) -m bench $(BENCH_ARGS)

release: venv ## every artifact of a version in dist/VERSION: images (OCI), install.yaml and chart pinned by digest, wheel, sdist, krew plugin, prometheus.yaml (VERSION=X.Y.Z; REGISTRY, PLUGIN_BASE_URL, RUNBOOK_BASE_URL)
	@test -n "$(VERSION)" || { echo "make release: give VERSION=X.Y.Z (the version the tree says)"; exit 2; }
	$(PY) -m release.artifacts --version "$(VERSION)" --registry "$(REGISTRY)" --plugin-base-url "$(PLUGIN_BASE_URL)" --runbook-base-url "$(RUNBOOK_BASE_URL)"

plugin-archive: venv ## the kubectl plugin as one executable, its krew archive and manifest in dist/ (BASE_URL=https://... where they will be published)
	$(PY) -m release.plugin --out dist --base-url "$(BASE_URL)"

clean: ## remove the virtualenv and caches in the repo (keeps built binaries)
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
