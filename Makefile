# Two commands for a newcomer: `make demo` and `make test`. Each creates its own
# virtual environment on first use (.venv, .venv-test) and reuses it afterwards.
# .venv holds what a board installs (the runtime); .venv-test adds the lab (lab/:
# bench, soak, eval, the compiler's benchmark), which the tests measure too.
PYTHON ?= python3

.PHONY: demo test test-fast test-numpy1 test-boards docs-api clean

demo: .venv/.installed
	.venv/bin/edgecap caption

test: .venv-test/.installed
	.venv-test/bin/python -m pytest -q

# The fast tier (under a minute on 2 cores; tests/fast_tier.py, docs/testing.md): every
# module's core behaviour. `make test` stays the whole suite and what CI runs. Compiled
# and assertion-rewritten test modules are cached (PYTHONDONTWRITEBYTECODE cleared):
# rewriting 80 test files again on every run costs ~10 s here.
test-fast: .venv-test/.installed
	PYTHONDONTWRITEBYTECODE= .venv-test/bin/python -m pytest -q -m "fast and not slow and not tf and not tpu"

# numpy<2, which makes pip take OpenCV 4.11 (what Coral's tflite-runtime 2.11 needs beside it),
# on the host's Python: CI runs it after `test`, so that edgecap keeps working there (it did
# not from 2e8a405 on: cv2.utils.logging). A venv in .cache/boards, built once.
test-numpy1:
	$(PYTHON) tools/test_boards.py --only native:numpy1 --out .cache/boards/test-numpy1.md

# Every configuration of the supported-configurations matrix (edgecap/data/configurations.json,
# docs/deploy.md): natively here, and the aarch64 ones under qemu (tools/aarch64/check.sh: slow,
# minutes each, and the first run downloads ~200 MiB and needs root). Writes a table.
test-boards:
	$(PYTHON) tools/test_boards.py --out .cache/boards/test-boards.md

# The API reference, from the public face's docstrings (pdoc; edgecap's __all__), in build/api/.
# `make test` builds the same (tests/test_api_docs.py) and fails on a docstring reference that
# names nothing; this target runs that check, then writes the pages.
docs-api: .venv-test/.installed
	.venv-test/bin/python -m pytest -q -p no:cacheprovider tests/test_api_docs.py
	rm -rf build/api
	.venv-test/bin/python -m pdoc -d google -o build/api edgecap

.venv/.installed: pyproject.toml
	$(PYTHON) -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e .
	touch $@

.venv-test/.installed: pyproject.toml lab/pyproject.toml
	$(PYTHON) -m venv .venv-test
	.venv-test/bin/pip install -q --upgrade pip
	.venv-test/bin/pip install -q -e ".[dev,service]" -e lab/
	touch $@

clean:
	rm -rf .venv .venv-test
