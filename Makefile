# pawn-queue: `make demo` runs the main job on a local directory, `make test` runs every check.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
COMPAT_VENV := .venv-pq013
VSQS_VENV := .venv-vsqs
DEMO_STAMP := $(VENV)/.demo-installed
STAMP := $(VENV)/.installed

.PHONY: demo demo-queue demo-spark test test-servers ceph lint typecheck docs docs-check pytest bench bench-store bench-queue bench-delays bench-spark bench-codec bench-worker bench-group-commit bench-batch-handlers bench-limits bench-priorities bench-replay bench-soak bench-cost bench-fleet chromium systemd clean

# What `make demo` needs: the library, its command line (Rich) and PySpark.
$(DEMO_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[cli,spark]"
	touch $(DEMO_STAMP)

# What `make test` and the benchmarks need besides: the other extras and the dev group (the
# test and lint tools, the S3 servers, Playwright, MkDocs).
$(STAMP): $(DEMO_STAMP)
	$(PY) -m pip install --quiet -e ".[cli,metrics,spark,dashboard]" --group dev
	touch $(STAMP)

# pawn-queue 0.1.3 from PyPI, in its own venv (same import name), for the compatibility tests.
$(COMPAT_VENV)/.installed:
	test -x $(COMPAT_VENV)/bin/python || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install --quiet "pawn-queue==0.1.3"
	touch $(COMPAT_VENV)/.installed

# The main job on the embedded default (a local directory, local Spark): the queue, then the
# Spark pipeline over it, where the topic orders has two subscriptions, service (the order
# service's consumers) and revenue (the Spark query): each is checked to get every order once.
demo: demo-queue demo-spark

demo-queue: $(DEMO_STAMP)
	$(PY) examples/demo.py

demo-spark: $(DEMO_STAMP)
	$(PY) examples/orders_pipeline.py --reset --url file://./pipeline-demo --out ./pipeline-demo-out

# ruff, and the package's layers (the contract in pyproject.toml's [tool.importlinter]).
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples docs/_hooks
	$(VENV)/bin/ruff format --check src tests bench examples docs/_hooks
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The documentation site (MkDocs Material, mkdocs.yml): `make docs` builds it into site/;
# `make docs-check` builds it with --strict into a temporary directory, so a broken link,
# a missing page or an API reference that does not resolve fails `make test`.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs
docs: $(STAMP)
	$(MKDOCS) build --strict --site-dir site

docs-check: $(STAMP)
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
		$(MKDOCS) build --strict --site-dir "$$tmp"

# $(call apt_install,PACKAGES): Debian packages with apt-get, as root or through sudo.
apt_install = if [ "$$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi; \
	$$sudo apt-get update -qq && $$sudo apt-get install -y --no-install-recommends $(1)

# Debian's Chromium for the dashboard's browser tests (Playwright drives it; it downloads
# no browser of its own). Without apt-get those tests are skipped, saying why.
CHROMIUM := /usr/bin/chromium
chromium:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		$(call apt_install,chromium); \
	else \
		echo "apt-get not found: install Chromium at $(CHROMIUM), or the dashboard's browser tests are skipped"; \
	fi

# Debian's systemd for tests/docs/test_systemd_units.py: `systemd-analyze verify` loads the
# docs' units (nothing is started). Without apt-get that test is skipped, saying why.
SYSTEMD_ANALYZE := /usr/bin/systemd-analyze
systemd:
	@if [ -x $(SYSTEMD_ANALYZE) ]; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		$(call apt_install,systemd); \
	else \
		echo "apt-get not found: install systemd (systemd-analyze), or the docs' unit test is skipped"; \
	fi

# The store matrix's servers besides SeaweedFS (a Python package) and moto (in the dev
# group): Ceph RGW from Debian's packages, s3rver and Azurite from npm (tests/servers/npm).
CEPH_PACKAGES := ceph-mon ceph-osd radosgw
ceph:
	@if command -v radosgw >/dev/null 2>&1 && command -v ceph-osd >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		$(call apt_install,$(CEPH_PACKAGES)); \
	else \
		echo "apt-get not found: install $(CEPH_PACKAGES) (Ceph 16.2+), the Ceph RGW tests need them"; \
		exit 1; \
	fi

NPM_DIR := tests/servers/npm
$(NPM_DIR)/node_modules/.installed: $(NPM_DIR)/package.json $(NPM_DIR)/package-lock.json
	cd $(NPM_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

test-servers: ceph $(NPM_DIR)/node_modules/.installed

# The suite mostly waits (servers, processes, leases): it runs in PYTEST_WORKERS processes
# (pytest-xdist; 0 for one process), for which the controller starts the test servers once
# (tests/servers/shared.py). A test that failed there runs once more in one process, named
# in the output: the workers share one server of each kind on 2 cores, and a lease bound a
# saturated server misses is the machine's, not the code's; failing again fails. Then the
# tests marked `alone` (timing-dependent: Spark, s3rver's queue tests, strict order and
# request counts) run in two workers (they mostly wait; each worker that runs a Spark test
# starts a Spark session of its own), and what failed there once more in one process.
# Every phase runs; any failing fails (docs/development/layout.md).
PYTEST_WORKERS ?= 5
PYTEST := PAWNQUEUE_COMPAT_PYTHON=$(abspath $(COMPAT_VENV))/bin/python $(VENV)/bin/pytest -q
pytest: $(STAMP) $(COMPAT_VENV)/.installed chromium systemd test-servers
	rm -rf .pytest_cache; \
	$(PYTEST) --numprocesses $(PYTEST_WORKERS) --durations=60 -m "not alone"; status=$$?; \
	if [ $$status -eq 1 ] && [ "$(PYTEST_WORKERS)" != 0 ]; then \
		echo "== failed beside other workers; once more in one process:"; \
		$(PYTEST) --last-failed --last-failed-no-failures none -m "not alone" -rA; status=$$?; \
	fi; \
	if [ "$(PYTEST_WORKERS)" = 0 ]; then $(PYTEST) --durations=10 -m alone || status=1; else \
		$(PYTEST) --numprocesses 2 --durations=30 -m alone; alone=$$?; \
		if [ $$alone -eq 1 ]; then \
			echo "== failed beside the other worker; once more in one process:"; \
			$(PYTEST) --last-failed --last-failed-no-failures none -m alone -rA; alone=$$?; \
		fi; \
		[ $$alone -eq 0 ] || status=1; \
	fi; exit $$status

test: lint typecheck docs-check pytest

# vsqs 0.3 from PyPI, in its own venv, for the local-directory comparison in bench/queue/compare.py.
$(VSQS_VENV)/.installed:
	test -x $(VSQS_VENV)/bin/python || $(PYTHON) -m venv $(VSQS_VENV)
	$(VSQS_VENV)/bin/python -m pip install --quiet "vsqs==0.3"
	touch $(VSQS_VENV)/.installed

bench-store: $(STAMP)
	$(PY) -m bench.micro.store

bench-queue: $(STAMP) $(COMPAT_VENV)/.installed $(VSQS_VENV)/.installed
	$(PY) -m bench.queue.compare

# When delayed, requeued and retried messages arrive against when they were asked for.
bench-delays: $(STAMP)
	$(PY) -m bench.queue.delays

# local[2] on a local directory, then a standalone cluster (two one-core workers) on SeaweedFS.
bench-spark: $(STAMP)
	$(PY) -m bench.spark.local
	$(PY) -m bench.spark.cluster

# JSON encode and decode: the standard library, orjson, msgspec and the library's codec.
bench-codec: $(STAMP)
	$(PY) -m bench.micro.codec

# The worker against listen(), and --processes 2 against 1 (a CPU-bound handler).
bench-worker: $(STAMP)
	$(PY) -m bench.handlers.worker

# Single publish() calls with group commit on and off and on pawn-queue 0.1.3, on SeaweedFS: messages/s and $/million.
bench-group-commit: $(STAMP) $(COMPAT_VENV)/.installed
	$(PY) -m bench.cost.group_commit

# Idle cost on SeaweedFS (not in `make bench`: ~25 min): requests a minute of 10/100/1,000 idle
# listened topics, wake-up from another process, idle poll() LISTs, poll() vs listen() $/million.
.PHONY: bench-idle
bench-idle: $(STAMP)
	$(PY) -m bench.cost.idle

# Limits across 4 processes on a local directory (~6 min): concurrency_limit("api", 3) against
# 3 handlers' worth, rate_limit("api", "20/s") against 20 a second, requests per use; then a
# rate limit against the store's latency, in one process (~2 min).
bench-limits: $(STAMP)
	$(PY) -m bench.handlers.limits
	$(PY) -m bench.handlers.rate_latency

# 100 messages of priority 9 against a backlog of 10,000 of priority 0, 4 consumer processes.
bench-priorities: $(STAMP)
	$(PY) -m bench.queue.priorities

# Batch handlers (listen(batch=100)) against per-message listen() on batch objects of 100, memory and SeaweedFS.
bench-batch-handlers: $(STAMP)
	$(PY) -m bench.handlers.batch

# Subscriptions on SeaweedFS (not in `make bench`: 6-12 min): a topic against 1, 3 and 10
# subscriptions (msg/s and $/million per subscription, every delivery checked), a 1% filter's cost.
.PHONY: bench-subscriptions
bench-subscriptions: $(STAMP)
	$(PY) -m bench.cost.subscriptions

# seek back one hour over 100,000 retained messages on SeaweedFS: first redelivery, all of it, requests.
bench-replay: $(STAMP)
	$(PY) -m bench.cost.replay

# The common case's cost by publish rate (not in `make bench`: ~11 min): one producer process
# awaiting publish() at 1, 10 and 100 msg/s, one listen() process; requests and $/million per
# message (SeaweedFS's counters), against SQS; publish-to-handler p50/p99; every message checked.
# COST_ARGS="--claims message": the topic claims each message on its own (not in runs).
COST_ARGS ?=
bench-cost: $(STAMP)
	$(PY) -m bench.cost.curve $(COST_ARGS)

# A fleet through a proxy counting per-key writes (not in `make bench`: ~3 min): 4 producers x
# 10 msg/s, 8 and 24 listen() processes on one topic; requests/message and /s, the hottest keys,
# what 1 write/s per key and 750 req/s per bucket would refuse (FLEET_ARGS=--limits: enforced).
FLEET_ARGS ?=
bench-fleet: $(STAMP)
	$(PY) -m bench.cost.fleet $(FLEET_ARGS)

bench: bench-store bench-queue bench-delays bench-spark bench-codec bench-worker bench-group-commit bench-batch-handlers bench-limits bench-priorities bench-replay

# Soak (not in `make bench` or `make test`): SOAK_MINUTES of producers and consumers on S3
# through injected network faults, then a drain and an audit; fails if a message was lost.
SOAK_MINUTES ?= 10
bench-soak: $(STAMP)
	$(PY) -m bench.soak.faults --minutes $(SOAK_MINUTES) --out bench/results/soak.json

clean:
	rm -rf $(VENV) $(COMPAT_VENV) $(VSQS_VENV) $(NPM_DIR)/node_modules site .pytest_cache .mypy_cache .ruff_cache bench/results
