# draftsmith: `make demo` runs the main job on the embedded default target; `make test` runs the tests.
# Both create .venv and install the project into it first.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: env test test-fast demo demo-quick clean-env

$(VENV)/.ready: pyproject.toml scripts/bootstrap.sh
	scripts/bootstrap.sh dev,serve
	touch $@

env: $(VENV)/.ready

test: env
	WANDB_MODE=offline HF_HUB_OFFLINE=1 $(PY) -m pytest -q $(PYTEST_ARGS)

test-fast: env
	WANDB_MODE=offline HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "not slow and not distributed" $(PYTEST_ARGS)

demo: env
	WANDB_MODE=offline $(VENV)/bin/draftsmith demo

demo-quick: env
	WANDB_MODE=offline $(VENV)/bin/draftsmith demo --quick

clean-env:
	rm -rf $(VENV)
