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
PYTEST_ARGS ?=

DAY0_IMAGE  ?= day0:local

.PHONY: demo test lint install fixtures bench clean docker-engine images image

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0 $(TORCH_ARGS)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	@set -e; for m in $(FIXTURES); do \
	  echo "=== day0 validate tests/fixtures/models/$$m --target $(DEMO_TARGET)"; \
	  $(VENV)/bin/day0 validate tests/fixtures/models/$$m --target $(DEMO_TARGET) \
	    --text tests/fixtures/text/heldout.txt --out out/demo/$$m; \
	done

# `make test` checks the layer contracts first (seconds; fails fast), then sets up Docker and
# builds the images itself: the tests marked `docker` always run.
test: lint images
	$(PY) -m pytest $(PYTEST_ARGS)

# import-linter contracts in pyproject.toml: engine/Prefect adapter, stage independence, a
# torch-free receiver, no import cycles (tests/test_layers.py shows each one failing)
lint: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache --no-logo

# A Docker engine (installs/starts Debian's dockerd when none answers) + the compose v2 plugin.
docker-engine: $(STAMP)
	VENV=$(VENV) scripts/docker_engine.sh

# day0/base:bookworm (debootstrap, cached), build/wheelhouse, $(DAY0_IMAGE); nothing is pulled.
images: $(STAMP) docker-engine
	VENV=$(VENV) DAY0_IMAGE=$(DAY0_IMAGE) TORCH_INDEX=$(or $(TORCH_INDEX),https://download.pytorch.org/whl/cpu) \
	  scripts/build_images.sh
image: images

fixtures: $(STAMP)
	$(PY) scripts/make_fixtures.py

bench: images
	@for b in bench/bench_*.py; do echo "=== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf out .pytest_cache
