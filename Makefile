# One venv per column of the tested-versions matrix (docs/versions.md): .venv is torch 2.9.0 with
# torch_xla 2.9.0 (`make test`, the README's test command); .venv-latest the newest torch
# and jax that install here; .venv-colab the Colab TPU runtime's versions.
PY ?= python3
# tests/ and the notebooks (nbval) on two workers, one per core here (pytest-xdist): each worker
# runs one stretch of tests/ in the serial order, then takes notebooks, each whole in one kernel,
# until none is left (tests/conftest.py's units).
PYTEST := pytest -q -n 2 --durations=25
TESTS := $(PYTEST) tests notebooks --nbval-lax --sanitize-with notebooks/sanitize.cfg
# uv installs a column in seconds where pip took minutes (the two torch 2.9.0 columns share its
# cache: one download, hard links into each venv). uv reads no pip configuration: it is handed
# pip's find-links, where machines of this kind keep torch 2.13.0's CPU build. It compiles the
# bytecode at install (uv's default leaves it to the first import, and where Python writes none,
# PYTHONDONTWRITEBYTECODE=1 as on these machines, every process compiled torch's, jax's and
# transformers' sources again: `import torch, jax, transformers, xlakit` took 10.7 s, 5.2 s compiled).
UV := uv==0.13.9
UV_PIP = $*/bin/uv pip install -q --compile-bytecode --python $*/bin/python
export UV_FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(PY) -m pip config get global.find-links 2>/dev/null))

.PHONY: venv test test-latest test-colab dist test-wheel browser graphviz screenshots js lab bench fuzz clean

venv: .venv/.installed

.venv/.installed: STACK := requirements-test.txt
.venv-latest/.installed: STACK := requirements-latest.txt
.venv-colab/.installed: STACK := requirements-colab.txt
.venv/.installed: requirements-test.txt
.venv-latest/.installed: requirements-latest.txt
.venv-colab/.installed: requirements-colab.txt
# a bench peer only: torch_xla's wheel carries an older copy of torchax, which this replaces
.venv/.installed: PEER := torchax==0.0.13

# xlakit is installed with its dependencies, after the stack's pins: check_stack fails if that
# moved any pinned version (as `%pip install xlakit` must not on Colab).
%/.installed: pyproject.toml requirements-tools.txt
	test -x $*/bin/python || $(PY) -m venv $*
	$*/bin/pip install -q $(UV)
	$(UV_PIP) -r $(STACK)
	$(if $(PEER),$(UV_PIP) --reinstall --no-deps $(PEER))
	$(UV_PIP) -e .
	$*/bin/python scripts/check_stack.py $(STACK)
	touch $@

test: venv browser graphviz
	.venv/bin/python -m $(TESTS)

# The other columns leave to `make test`'s the modules that their versions do not change
# (docs/versions.md): the benchmarks' smoke runs (`make bench` runs in .venv) and the browser test
# (.venv-latest has .venv's JupyterLab, ipywidgets and anywidget; Colab's frontend is not JupyterLab).
# Each column splits its two stretches where its own run's time halves (tests/conftest.py).
ONE_COLUMN := tests/test_bench_smoke.py tests/test_browser.py

# Current torch and jax, without torch_xla (its tests skip). Its jax is .venv's: the disk
# cache's faults and directories, JAX's and xlakit's alone, are make test's. The notebooks run in
# the two places users run them, .venv's Jupyter and Colab: here the suite tests what they call.
test-latest: .venv-latest/.installed browser graphviz
	XLAKIT_SECOND_STRETCH=tests/test_moe.py .venv-latest/bin/python -m $(PYTEST) tests \
	  $(addprefix --ignore ,$(ONE_COLUMN) tests/test_faults.py tests/test_cache_dir.py)

# The Colab TPU stack: the suite and the notebooks top to bottom. Its torch is .venv's: what
# torch alone decides is make test's: the torch.compile modules (Dynamo's frames and FX graphs;
# their ops lower as the lazy tests' do here, and notebooks/07 runs torch.compile here whole),
# test_real_models' zoo (each model's ops; transformers models still train here in test_moe,
# test_numerics, test_spmd and notebooks/01), and the modules of torch's and Python's side alone:
# views and their strides (functionalization, meta kernels), ops that run eagerly, torch's APIs,
# source lines, the recording's guards and transformers' generate loop.
TORCH_SIDE := views view_strides mixed_devices torch_interop sources replay generation
test-colab: .venv-colab/.installed graphviz
	XLAKIT_SECOND_STRETCH=tests/test_lowerings_reductions.py .venv-colab/bin/python -m $(TESTS) \
	  $(addprefix --ignore ,$(ONE_COLUMN) $(addprefix tests/test_,$(addsuffix .py,compiled_adversarial \
	  compiled_device compile_regressions explain_device graph_breaks moe_compiled real_models $(TORCH_SIDE))))

# The sdist and the wheel, into dist/, through the standard build front end; the wheel is built
# from the sdist, so a file missing from either is missing from both (tests/test_wheel.py installs
# this wheel in a fresh venv and runs the quickstart there). An old xlakit.egg-info goes first:
# setuptools would read its file list into the sdist.
dist: venv
	rm -rf dist xlakit.egg-info
	.venv/bin/python -m build --outdir dist .

# Builds the wheel as `make dist` does, installs it with pip in a fresh venv that uv filled with
# requirements-latest.txt's runtime pins (UV_FIND_LINKS, above), and runs notebooks/01_quickstart.ipynb
# there (about a minute: CI runs it once, not per column).
test-wheel: venv
	XLAKIT_TEST_WHEEL=1 .venv/bin/python -m pytest -q tests/test_wheel.py

# Chromium for the widget test in a real browser (Debian package; Playwright
# cannot download its own browsers here). Without root or apt the test skips.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -q && apt-get install -y -q chromium) >/dev/null; } || \
	  echo "chromium could not be installed: tests/test_browser.py will skip"

# The README's screenshots: tests/test_browser.py writes docs/quickstart.png and docs/graph_*.png
# (under `make test` it writes them to a temporary folder and leaves the tree as it was).
screenshots: venv browser graphviz
	XLAKIT_SCREENSHOTS=docs .venv/bin/python -m pytest -q tests/test_browser.py

# Graphviz's `dot` lays out the static graph (Debian package; Colab has it). Without it the
# views fall back to xlakit's own layout, and the tests of the dot layout skip.
graphviz:
	@command -v dot >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -q && apt-get install -y -q graphviz) >/dev/null; } || \
	  echo "graphviz could not be installed: the static graph falls back to xlakit's own layout"

# The graph widget's JavaScript: js/src and its libraries (package-lock.json) bundled by esbuild
# into xlakit/notebook/static/graph.js, which is committed (pip installs from git need no node).
# tests/test_graph_view.py fails when the committed bundle was not built from the committed sources.
js:
	cd js && npm ci --no-audit --no-fund && node build.mjs

lab: venv graphviz
	.venv/bin/jupyter lab notebooks/

bench: venv
	PJRT_DEVICE=CPU .venv/bin/python bench/tracing.py
	.venv/bin/python bench/render.py
	PJRT_DEVICE=CPU .venv/bin/python bench/compiled.py
	PJRT_DEVICE=CPU .venv/bin/python bench/executable_call.py
	PJRT_DEVICE=CPU .venv/bin/python bench/training.py
	PJRT_DEVICE=CPU .venv/bin/python bench/real_models.py
	.venv/bin/python bench/sharding.py

fuzz: venv
	XLAKIT_FUZZ_EXAMPLES=$${XLAKIT_FUZZ_EXAMPLES:-2000} XLAKIT_FUZZ_RANDOM=1 .venv/bin/python -m pytest -q tests/test_fuzz.py

clean:
	rm -rf .venv .venv-latest .venv-colab dist
