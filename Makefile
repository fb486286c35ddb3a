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

# The shipped demo model's five-phase recipe (about 95 min on 2 CPU cores; bench/RESULTS.md has
# each phase's curve and why it exists): phase 1 follows a 6000-step cosine schedule and stops
# at step 4000; phases 2 and 3 restart the learning rate with a third of the batches drawn from
# the image tasks; phases 4 and 5 also cut half / 70% of the windows after their answer, so the
# model answers the same in a window Seer has shortened. Writes model_adapters/embedded/.
EMB := $(PY) -m model_adapters.embedded.train --threads 2
train-demo-model: $(STAMP)
	$(EMB) --steps 6000 --stop-at 4000 --seed 0 --save-dtype float32 --final-eval-requests 96 \
		--out build/embedded-phase1
	$(EMB) --steps 3000 --stop-at 1500 --seed 1 --lr 1.2e-3 --warmup 100 --image-focus 0.35 \
		--save-dtype float32 --final-eval-requests 96 --init-from build/embedded-phase1 --out build/embedded-phase2
	$(EMB) --steps 1500 --seed 3 --lr 6e-4 --warmup 50 --image-focus 0.35 --eval-every 500 \
		--final-eval-requests 96 --init-from build/embedded-phase2 --out build/embedded-phase3
	$(EMB) --steps 1000 --seed 4 --lr 4e-4 --warmup 50 --image-focus 0.35 --window-cut 0.5 --eval-every 500 \
		--final-eval-requests 96 --init-from build/embedded-phase3 --out build/embedded-phase4
	$(EMB) --steps 1500 --seed 5 --lr 4e-4 --warmup 50 --image-focus 0.35 --window-cut 0.7 --eval-every 500 \
		--init-from build/embedded-phase4

gpu-check: $(STAMP)
	bash bench/gpu_check.sh

clean-venv:
	rm -rf $(VENV)
