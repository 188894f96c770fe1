# One venv for everything. torch==2.9.0 so torch_xla 2.9.0 can join it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test browser lab bench fuzz clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements-test.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch_xla's wheel carries an older copy of torchax: install it first and
	# let the pinned torchax overwrite that copy.
	$(BIN)/pip install -q -r requirements-test.txt
	$(BIN)/pip install -q --force-reinstall --no-deps torchax==0.0.13
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

test: venv browser
	$(BIN)/python -m pytest -q tests notebooks --nbval-lax --sanitize-with notebooks/sanitize.cfg

# Chromium for the widget test in a real browser (Debian package; Playwright
# cannot download its own browsers here). Without root or apt the test skips.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -q && apt-get install -y -q chromium) >/dev/null; } || \
	  echo "chromium could not be installed: tests/test_browser.py will skip"

lab: venv
	$(BIN)/pip install -q jupyterlab
	$(BIN)/jupyter lab notebooks/

bench: venv
	PJRT_DEVICE=CPU $(BIN)/python bench/tracing.py
	$(BIN)/python bench/render.py
	PJRT_DEVICE=CPU $(BIN)/python bench/compiled.py
	PJRT_DEVICE=CPU $(BIN)/python bench/training.py

fuzz: venv
	XLAKIT_FUZZ_EXAMPLES=$${XLAKIT_FUZZ_EXAMPLES:-2000} XLAKIT_FUZZ_RANDOM=1 $(BIN)/python -m pytest -q tests/test_fuzz.py

clean:
	rm -rf $(VENV)
