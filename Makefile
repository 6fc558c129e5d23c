# Two commands on a fresh machine: `make demo` (the main job) and `make test`.
PY := .venv/bin/python
export PYTHONHASHSEED := 0
# The unit tests run on this many processes (pytest-xdist): both cores of the 2-core machines
# they are budgeted on; the end-to-end tests run one at a time (they time real engines).
UNIT_WORKERS ?= 2

.PHONY: bootstrap bootstrap-vllm bootstrap-aiperf bootstrap-test-tools demo test test-unit test-e2e lint bench bench-pressure bench-clients bench-peers model

bootstrap: .venv/.complete
.venv/.complete: scripts/bootstrap.sh constraints/lock-main.txt pyproject.toml
	scripts/bootstrap.sh main

bootstrap-vllm:
	scripts/bootstrap.sh vllm

bootstrap-aiperf:
	scripts/bootstrap.sh aiperf

bootstrap-test-tools:
	scripts/bootstrap.sh test-tools

model: bootstrap
	$(PY) -m radix_global_cli make-model build/tiny-llama

demo: bootstrap
	$(PY) -m benchmarks.scenarios.demo

# The vLLM venv is needed by the router's end-to-end test in front of real vLLM workers.
# The slowest end-to-end tests are listed: the whole run must stay within its 50-minute budget.
test: bootstrap bootstrap-vllm bootstrap-test-tools lint
	$(PY) -m pytest -m "not e2e" -q -n $(UNIT_WORKERS)
	$(PY) -m pytest -m "e2e" -q --durations=15

test-unit: bootstrap bootstrap-test-tools
	$(PY) -m pytest -m "not e2e" -q -n $(UNIT_WORKERS)

test-e2e: bootstrap bootstrap-vllm bootstrap-test-tools
	$(PY) -m pytest -m "e2e" -q

lint: bootstrap
	$(PY) -m ruff check .
	$(PY) -m mypy radix_global radix_global_cli radix_global_tools router sglang_patch benchmarks

bench: bootstrap
	$(PY) -m benchmarks.scenarios.bench

# Issue 15's scenario: small local caches, two workloads over a load sweep (~35 minutes).
bench-pressure: bootstrap
	$(PY) -m benchmarks.scenarios.pressure_bench

# Issue 42's independent client: our replay and NVIDIA's aiperf on the same requests at the same
# times, through make demo's pair, four repeats (~27 minutes).
bench-clients: bootstrap bootstrap-aiperf
	$(PY) -m benchmarks.scenarios.client_agreement

# Issue 42's check that each peer's cache-aware mode is configured as its users would run it:
# second turns reach their history holder; round robin must fail (~6 minutes).
bench-peers: bootstrap
	$(PY) -m benchmarks.scenarios.peer_check
