# Two entry points that work on a fresh machine: `make run` and `make test`.
SHELL := /bin/bash
# The venv's interpreter: Debian's CPython when it can make a venv (python3.11-venv), else python3. Debian builds
# it with PGO and LTO; pyenv's default build (the python3 on PATH here) has neither and ran this code 1.5x slower
# (bench/replicas.py: CPU per POST /v1/grants 5.8 -> 3.8 ms; README, Performance).
PYTHON ?= $(shell /usr/bin/python3.11 -c 'import ensurepip, venv' >/dev/null 2>&1 && echo /usr/bin/python3.11 || echo python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SYSTEM_TOOLS := softhsm2-util:softhsm2 nft:nftables openssl:openssl initdb:postgresql ip:iproute2 \
	ovs-vswitchd:openvswitch-switch ethtool:ethtool chromium:chromium curl:curl

.PHONY: run test lint bench system-deps clean

$(STAMP): pyproject.toml requirements.lock requirements-regorus.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --require-hashes --no-deps -r requirements-regorus.txt
	$(BIN)/python -m pip install -q -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

# development mode: the embedded defaults, and a policy version activates without a signature (README)
run: $(STAMP)
	TRUSTFABRIC_MODE=development $(BIN)/trustfabric serve

# Installs the Debian packages the tests use when running as root and one is missing.
system-deps:
	@missing=""; for pair in $(SYSTEM_TOOLS); do cmd=$${pair%%:*}; pkg=$${pair##*:}; \
	  if ! command -v $$cmd >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/$$cmd >/dev/null 2>&1; then missing="$$missing $$pkg"; fi; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "not root, cannot install:$$missing (tests needing them will skip and say why)"; fi; fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# --max-worker-restart 0: a crashed worker ends the run with its test named; xdist 3.8 replacing a worker
# under --dist loadgroup re-queues finished work and then waits for ever (pytest-xdist#1378).
# pytest stays at 9.1.1 (requirements.lock): with 9.2, xdist 3.8 ignores xdist_group marks (pytest-xdist#1386).
# PYTHONDONTWRITEBYTECODE emptied (some machines set it): pytest rewrites the asserts of its plugins (xdist,
# hypothesis, schemathesis, anyio: ~250 modules) as it loads them, before tests/conftest.py can turn bytecode writing
# back on, and with the variable set it cached none of them: each pytest process (the controller and each worker)
# rewrote them all again, ~0.9 s of CPU. Written once, they are read by every later run, the variable set or not.
test: system-deps $(STAMP) lint
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -n 2 --dist loadgroup --max-worker-restart 0

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
