# The README's two set-up commands: `make demo` and `make test`. Each creates (or reuses) a local
# virtual environment and installs what the project needs. torch is installed first, pinned to
# the CPU build on disk, so that nothing pulls a multi-GB CUDA wheel.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.seer-installed

.PHONY: demo test bench lint train-demo-model gpu-check clean-venv

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev,plot]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/seer demo

test: $(STAMP)
	$(PY) -m pytest --benchmark-disable

bench: $(STAMP)
	$(PY) -m pytest bench -m bench --benchmark-columns=median,iqr,rounds

lint: $(STAMP)
	$(VENV)/bin/ruff check .

train-demo-model: $(STAMP)
	$(PY) -m model_adapters.embedded.train

gpu-check: $(STAMP)
	bash bench/gpu_check.sh

clean-venv:
	rm -rf $(VENV)
