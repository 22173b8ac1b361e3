# The two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest protos bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m control_plane.demo

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Two workers, a test file per worker at a time (its module fixtures stay together). The
# demo's end-to-end test (about 2.5 min, mostly the node's bake) runs beside the rest
# from the start instead of trailing it on one worker; its output follows the rest's, and
# either failing fails.
DEMO_TEST   := tests/test_demo.py
PYTEST_ARGS ?= -n 2 --dist loadfile --ignore=$(DEMO_TEST)

pytest: $(STAMP)
	@$(BIN)/pytest -q -p no:cacheprovider $(DEMO_TEST) > .pytest-demo.log 2>&1 & demo=$$!; \
	$(BIN)/pytest $(PYTEST_ARGS); rest=$$?; \
	wait $$demo; demo_rc=$$?; \
	echo "--- $(DEMO_TEST), run beside the rest (exit $$demo_rc):"; cat .pytest-demo.log; \
	rm -f .pytest-demo.log; \
	test $$rest -eq 0 && test $$demo_rc -eq 0

protos: $(STAMP)
	$(BIN)/python -m protos.generate

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .demo .bench
