# The two commands the README promises: `make plan` and `make test`, on a fresh machine with Python 3.11 and make.
PYTHON ?= python3
VENV   ?= .venv
STACK  ?= dev
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

E2E    ?= .e2e
# actionlint checks the example pull-request workflow in `make test`; built from its Go module like the e2e tools.
ACTIONLINT_VERSION := v1.7.12
ACTIONLINT := $(BIN)/actionlint-$(ACTIONLINT_VERSION)

.PHONY: plan test e2e e2e-tools install schema bench clean

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

test: $(STAMP) $(ACTIONLINT)
	$(BIN)/python -m pytest -q

# The real control plane (etcd, apiserver, controller-manager, scheduler, kubectl, KWOK, Kueue) from Go modules;
# a binary is rebuilt only when its pinned version changes.
e2e-tools:
	e2e/build-tools.sh $(E2E)

e2e: $(STAMP) e2e-tools
	GPUCLUSTER_E2E=1 GPUCLUSTER_E2E_TOOLS=$(abspath $(E2E)) $(BIN)/python -m pytest -q -m e2e tests/e2e

# Scale: plan time, memory, graph shape and blast radius from 16 to 2,048 nodes against Pulumi's floor
# (about an hour on 2 cores at full size; `$(BIN)/python bench/bench.py 16 128` for a quick look).
bench: $(STAMP)
	$(BIN)/python bench/bench.py

schema: $(STAMP)
	$(BIN)/gpucluster schema --out stacks/clusterspec.schema.json

clean:
	rm -rf build $(VENV)
