# draftsmith: `make demo` runs the main job on the embedded default target; `make test` runs the tests.
# Both create .venv and install the project into it first.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# Two pytest workers, whole files each (pytest-xdist): the tests run torch on one thread, so two cores take two
# files at once; the real-target and distributed files keep their own worker.
TEST_WORKERS ?= 2

.PHONY: env test test-fast demo demo-quick clean-env

$(VENV)/.ready: pyproject.toml scripts/bootstrap.sh
	scripts/bootstrap.sh dev,serve
	touch $@

env: $(VENV)/.ready

test: env
	WANDB_MODE=offline HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-fast: env
	WANDB_MODE=offline HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow and not distributed" $(PYTEST_ARGS)

demo: env
	WANDB_MODE=offline $(VENV)/bin/draftsmith demo

demo-quick: env
	WANDB_MODE=offline $(VENV)/bin/draftsmith demo --quick

clean-env:
	rm -rf $(VENV)
