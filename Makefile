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

# The shipped demo model's two-phase recipe (about 66 min on 2 CPU cores; bench/RESULTS.md has
# the curves and why each flag exists): phase 1 trains the SigLIP tower alone on the cells, fits
# the projector so that a cell token is the sum of its words' embeddings and keeps both frozen
# while the backbone learns the tasks (with reading drills, extra image questions and half the
# windows cut after their answer); phase 2 restarts at a lower learning rate with more image
# questions and 70% of the windows cut, so the model answers the same in a window Seer has
# shortened. Writes model_adapters/embedded/, then calibrates Seer (seer_config.json) and DyLLM
# (dyllm_config.json) for it.
EMB := $(PY) -m model_adapters.embedded.train --threads 2

train-demo-model: $(STAMP)
	$(EMB) --steps 5000 --seed 0 --no-bf16 --vision-steps 300 --align-steps 300 --freeze-projector --drill 0.15 \
		--image-focus 0.15 --window-cut 0.5 --eval-every 1000 --out build/embedded-phase1
	$(EMB) --steps 1500 --seed 5 --no-bf16 --lr 4e-4 --warmup 50 --image-focus 0.35 --window-cut 0.7 \
		--freeze-projector --eval-every 500 --init-from build/embedded-phase1
	$(VENV)/bin/seer calibrate --guard-mode redecode --out model_adapters/embedded/seer_config.json
	$(VENV)/bin/seer calibrate-dyllm --out model_adapters/embedded/dyllm_config.json

gpu-check: $(STAMP)
	bash bench/gpu_check.sh

clean-venv:
	rm -rf $(VENV)
