# The two commands the README promises: `make plan` and `make test`, on a fresh machine with Python 3.11 and make.
PYTHON ?= python3
VENV   ?= .venv
STACK  ?= dev
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: plan test install schema clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

plan: $(STAMP)
	$(BIN)/gpucluster plan $(STACK)

test: $(STAMP)
	$(BIN)/python -m pytest -q

schema: $(STAMP)
	$(BIN)/gpucluster schema --out stacks/clusterspec.schema.json

clean:
	rm -rf build $(VENV)
