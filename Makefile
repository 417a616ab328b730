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

.PHONY: demo test install fixtures bench clean

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

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

fixtures: $(STAMP)
	$(PY) scripts/make_fixtures.py

bench: $(STAMP)
	@for b in bench/bench_*.py; do echo "=== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf out .pytest_cache
