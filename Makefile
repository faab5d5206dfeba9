# The two commands of the README:
#   make demo   set up .venv if needed, then run the main job on the built-in tiny setup
#   make test   set up .venv (test extras, clang-19 for gfx compile checks) and run every test
#
# torch is installed only when none is importable: a CUDA or ROCm torch that is already
# installed (the venv sees system site-packages) is never replaced.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
TORCH_PIN := torch==2.13.0
# pytest workers (pytest-xdist): one a core, at most 4; 0: one process. A test file stays on
# one worker (--dist loadfile): its module fixtures (a torchrun, a wheel build) run once.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)

.PHONY: demo test venv toolchain lint clean

$(PY):
	$(PYTHON) -m venv --system-site-packages $(VENV)

$(VENV)/.torch: | $(PY)
	@$(PY) -c "import torch" 2>/dev/null && echo "using installed torch $$($(PY) -c 'import torch; print(torch.__version__)')" \
	  || { echo "no torch importable: installing $(TORCH_PIN)"; $(PIP) install $(TORCH_PIN) 2>&1 | grep -v '^WARNING: Location' || true; \
	       $(PY) -c "import torch"; }
	@touch $@

$(VENV)/.base: pyproject.toml $(VENV)/.torch
	$(PIP) install -e . 2>&1 | grep -v '^WARNING: Location' || true
	@$(PY) -c "import ftlab" && touch $@

$(VENV)/.test: pyproject.toml $(VENV)/.base
	$(PIP) install -e ".[dev,notebooks,oracle]" 2>&1 | grep -v '^WARNING: Location' || true
	@$(PY) -c "import hypothesis, nbclient, pytest, matplotlib, xdist" && touch $@

venv: $(VENV)/.test

# clang-19 compiles the HIP kernels for gfx targets without ROCm; a C++ compiler with OpenMP
# builds the CPU expert kernels (ftlab/cpu). Installed with apt when missing; where that cannot
# be done, the tests that need them skip and say why.
toolchain:
	@if command -v clang-19 >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "installing clang-19 lld-19 clang-tools-19"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-19 lld-19 clang-tools-19 >/dev/null; \
	else echo "clang-19 is missing and apt-get (as root) is not available: gfx compile checks will be skipped"; fi
	@if echo 'int main(){return 0;}' | c++ -fopenmp -x c++ - -o /dev/null 2>/dev/null; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "installing g++ (OpenMP)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null; \
	else echo "no C++ compiler with OpenMP and apt-get (as root) is not available: CPU kernel tests will be skipped"; fi

demo: $(VENV)/.base
	$(VENV)/bin/ftlab demo

test: $(VENV)/.test toolchain
	$(VENV)/bin/ruff check ftlab tests benchmarks
	$(VENV)/bin/ruff format --check ftlab tests benchmarks
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

lint: $(VENV)/.test
	$(VENV)/bin/ruff check ftlab tests benchmarks
	$(VENV)/bin/ruff format --check ftlab tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
