# The two commands the README promises: `make plan` and `make test`, on a fresh machine with Python 3.11 and make.
PYTHON ?= python3
VENV   ?= .venv
STACK  ?= dev
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

E2E    ?= .e2e
# pytest workers (pytest-xdist): the suites wait on SSH hosts, daemons and controllers more than they compute,
# so on CI's 2 cores two workers halve `make test` and three `make e2e` (README: The real control plane).
# 0 runs a suite in this process, one test at a time.
WORKERS     ?= 2
E2E_WORKERS ?= 3
# actionlint checks the example pull-request workflow in `make test`; built from its Go module like the e2e tools.
ACTIONLINT_VERSION := v1.7.12
ACTIONLINT := $(BIN)/actionlint-$(ACTIONLINT_VERSION)

# The TypeScript example, type-checked in `make test` against the SDK generated from the provider's schema.
TS_EXAMPLE := examples/tenant-and-pool/typescript
TS_STAMP   := $(TS_EXAMPLE)/node_modules/.installed

.PHONY: plan test e2e e2e-tools engine-e2e install schema sdk bench bench-apply clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet pip==26.3
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

plan: $(STAMP)
	$(BIN)/gpucluster plan $(STACK)

$(ACTIONLINT): $(STAMP)
	GOBIN=$(abspath $(BIN))/.actionlint go install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION)
	mv $(BIN)/.actionlint/actionlint $@ && rmdir $(BIN)/.actionlint
	ln -sf $(notdir $@) $(BIN)/actionlint

$(TS_STAMP): $(TS_EXAMPLE)/package-lock.json $(wildcard $(TS_EXAMPLE)/sdks/gpucluster/*)
	cd $(TS_EXAMPLE) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

test: $(STAMP) $(ACTIONLINT) $(TS_STAMP)
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile

# The real control plane (etcd, apiserver, controller-manager, scheduler, kubectl, KWOK, Kueue) from Go modules;
# a binary is rebuilt only when its pinned version changes.
e2e-tools:
	e2e/build-tools.sh $(E2E)

# The engine's tests are engine-e2e's alone (they would run here too, twice in CI, wherever the engine is built).
ENGINE_TESTS := tests/e2e/test_engine.py tests/e2e/test_engine_python.py
e2e: $(STAMP) e2e-tools
	GPUCLUSTER_E2E=1 GPUCLUSTER_E2E_TOOLS=$(abspath $(E2E)) $(BIN)/python -m pytest -q -m e2e tests/e2e \
	  -n $(E2E_WORKERS) --dist loadgroup $(addprefix --ignore=,$(ENGINE_TESTS))

# The real Pulumi engine (the CLI, its YAML and Python language hosts and the Kubernetes provider, from Go
# modules) runs the YAML examples against the component provider, and the project's own program for each
# environment against the control plane and the SSH test hosts (GPUCLUSTER_ENGINE_STACKS=dev: dev's alone).
engine-e2e: $(STAMP) e2e-tools
	e2e/build-tools.sh $(E2E) engine
	GPUCLUSTER_ENGINE_E2E=1 GPUCLUSTER_E2E_TOOLS=$(abspath $(E2E)) $(BIN)/python -m pytest -q -m e2e $(ENGINE_TESTS)

# Scale: plan time, memory, graph shape and blast radius from 16 to 2,048 nodes against Pulumi's floor
# (about an hour on 2 cores at full size; `$(BIN)/python bench/bench.py 16 128` for a quick look).
bench: $(STAMP)
	$(BIN)/python bench/bench.py

# `pulumi up` under the real engine against its critical path, commands sleeping their modelled durations
# (bench/apply.py; `$(BIN)/python bench/apply.py 16 128` for chosen sizes).
bench-apply: $(STAMP) e2e-tools
	e2e/build-tools.sh $(E2E) engine
	GPUCLUSTER_E2E_TOOLS=$(abspath $(E2E)) $(BIN)/python bench/apply.py

schema: $(STAMP)
	$(BIN)/gpucluster schema --out stacks/clusterspec.schema.json

# The component package's schema (provider/schema.json) and the TypeScript SDK generated from it, after a change
# to what components/provider.py exposes (a test says when). The generator is Pulumi's, built from its Go module.
sdk: $(STAMP)
	cd e2e/sdkgen && go build -o $(abspath $(BIN))/sdkgen .
	$(BIN)/python -m components.provider schema > provider/schema.json
	rm -rf $(TS_EXAMPLE)/sdks/gpucluster
	$(BIN)/sdkgen provider/schema.json $(TS_EXAMPLE)/sdks/gpucluster

clean:
	rm -rf build $(VENV)
