# Two commands for a newcomer: `make demo` and `make test`. Each creates its own
# virtual environment on first use (.venv, .venv-test) and reuses it afterwards.
PYTHON ?= python3

.PHONY: demo test clean

demo: .venv/.installed
	.venv/bin/edgecap caption

test: .venv-test/.installed
	.venv-test/bin/python -m pytest -q

.venv/.installed: pyproject.toml
	$(PYTHON) -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e .
	touch $@

.venv-test/.installed: pyproject.toml
	$(PYTHON) -m venv .venv-test
	.venv-test/bin/pip install -q --upgrade pip
	.venv-test/bin/pip install -q -e ".[dev,service]"
	touch $@

clean:
	rm -rf .venv .venv-test
