# AGMARL-DKS — the two commands that matter: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test install unit integration proto clean kube-e2e

$(STAMP): requirements.txt requirements-train.txt requirements-dev.txt constraints.txt pyproject.toml libs/testing/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements-dev.txt -c constraints.txt
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m pip install -q --no-deps -e libs/testing
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/agmarl up

test: $(STAMP)
	$(PY) -m pytest -q

unit: $(STAMP)
	$(PY) -m pytest -q libs services cli

integration: $(STAMP)
	$(PY) -m pytest -q tests

proto: $(STAMP)
	$(PY) tools/gen_proto.py

# A real kube-apiserver + kube-scheduler v1.36 (docs/kube-real.md): builds them into .state/kube/bin (needs the
# Go module proxy and an etcd: apt-get install -y etcd-server), then the end-to-end test against them. `make test`
# runs the same test against v1.20.2 built from Debian's source (tools/kube/build_debian.py) when bin/ is empty.
kube-e2e: $(STAMP)
	PYTHON=$(PY) tools/kube/build.sh
	$(PY) -m pytest -q tests/e2e/test_real_kube.py

clean:
	rm -rf .state .pytest_cache
