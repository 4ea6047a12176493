# Every target creates .venv when missing and installs what it needs.
# torch is pinned to 2.13.0: that CPU build lies on this machine's disk;
# other versions may download a multi-GB CUDA build. The editable install compiles
# daemon/inference/native/ in place: an edit there reinstalls.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.rlinkd-installed
TORCH  ?= torch==2.13.0

.PHONY: install demo lint checks test bytecode bench bench-report clean c-client c-check c-client-check c-headers native-check ort-old gpu-check

install: $(STAMP)

$(STAMP): pyproject.toml $(wildcard daemon/inference/native/*)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rlinkd demo --clients 2

# ruff and mypy (configured in pyproject.toml) before the tests; CI runs `make test`.
# mypy cannot follow the editable install's import hook: build/typecheck/rlinkd/ links the
# folders under their import names (rlinkd.daemon, rlinkd.shm, rlinkd.client_lib) for it.
lint: $(STAMP)
	mkdir -p build/typecheck/rlinkd
	for pkg in daemon shm client_lib; do ln -sfn ../../../$$pkg build/typecheck/rlinkd/$$pkg; done
	$(PY) -m ruff check .
	$(PY) -m mypy

# The C headers generated from the Python declarations (lane layouts, limits, message types and
# keys): daemon/inference/native/declared.h and client_lib/c/src/rlk_declared.h. Checked in;
# tests/unit/test_c_headers.py checks they are current.
c-headers: $(STAMP)
	$(PY) -m rlinkd.daemon.c_headers

# The C client (client_lib/c): libraries and the example into build/c; `c-check` adds the
# -Werror, AddressSanitizer and UndefinedBehaviorSanitizer builds and runs the C tests.
c-client:
	$(MAKE) -C client_lib/c

c-check: native-check c-client-check

# (separate targets: `make checks` runs the two side by side with lint)
c-client-check:
	$(MAKE) -C client_lib/c -j$$(nproc) check

# The inference role's extension (daemon/inference/native/) built with AddressSanitizer and
# UndefinedBehaviorSanitizer into build/native-asan/, and its tests run against that build.
NATIVE_SRC := $(wildcard daemon/inference/native/*.c)
native-check: $(STAMP)
	mkdir -p build/native-asan
	$(CC) -O1 -g -std=c11 -Wall -Wextra -Werror -fPIC -shared -fsanitize=address,undefined \
	  -fno-sanitize-recover=undefined -fno-omit-frame-pointer \
	  -I"$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
	  $(NATIVE_SRC) -o build/native-asan/_native.so -lm
	LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	  ASAN_OPTIONS=detect_leaks=0 PYTHONMALLOC=malloc $(PY) tests/native/run_sanitized.py build/native-asan/_native.so

# onnxruntime 1.15.1, the oldest runtime the exported ONNX is tested with (Godot RL Agents'
# C# plugin runs it), and the numpy 1 it needs, in a folder of their own beside the venv:
# tests/unit/test_onnx_opsets.py runs the export with it in a subprocess (PYTHONPATH).
ORT_OLD := build/ort-old
ort-old: $(ORT_OLD)/onnxruntime-1.15.1.dist-info

$(ORT_OLD)/onnxruntime-1.15.1.dist-info: | $(STAMP)
	rm -rf $(ORT_OLD)
	$(PY) -m pip install -q --no-deps --target $(ORT_OLD) onnxruntime==1.15.1 numpy==1.26.4

# Bytecode for the sources the tests run as subprocesses: the editable install compiles nothing,
# and where PYTHONDONTWRITEBYTECODE is set every daemon process would compile every module
# again (~0.2 s of CPU per role, six processes per daemon start, hundreds of starts per run).
bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 daemon shm client_lib bench tests >/dev/null

# The checks before the tests run side by side (mypy is single-threaded, the C builds use every
# core), then the tests: everything not marked `serial` on TEST_JOBS pytest-xdist workers (each
# takes a contiguous share of the files, an idle one takes tests from the end of another's
# share: a module's shared daemon starts again only where its tests are split), then the
# `serial` tests alone (their assertions bound latencies or heartbeats that a busy neighbour
# would break; all of them are real-process tests, so only the tests/process files that mark
# any are collected for them: a collection of all of tests/process costs ~4 s alone).
TEST_JOBS ?= $(shell nproc)
SERIAL_FILES = $(shell grep -l "mark\.serial" tests/process/*.py)
checks: lint native-check c-client-check ort-old bytecode docs

test: $(STAMP)
	$(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=target checks
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist worksteal -m "not serial"
	$(PY) -m pytest -q -p no:xdist -m serial $(SERIAL_FILES)

bench: $(STAMP)
	$(PY) -m bench.run_all

# BENCHMARKS.md from bench/report/benchmarks.toml and the result files it cites (no benchmark
# runs; tests/unit/test_bench_report.py checks the file is current).
bench-report: $(STAMP)
	$(PY) -m bench.report

# On a GPU host, issue 32's checks in one command (docs/gpu.md): the CUDA tests (marker `cuda`;
# pytest skips them without a GPU, so this target stops first), then the three GPU benchmarks one
# after another: SGD rows/s (CPU and CUDA rows and the 0.8 check in one run), `rlinkd demo` with
# defaults against a forced CPU (median of 3 each), MinAtar with the learner on CUDA and on the CPU
# (clients on all cores but two). Each writes its bench/results file; `make bench-report` after.
gpu-check: $(STAMP)
	$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu-check: torch sees no CUDA device')"
	$(PY) -m pytest -m cuda -q -rs tests/unit/test_learner_graphs.py tests/unit/test_inference_graphs.py
	$(PY) -m bench.scenarios.learner_device
	$(PY) -m bench.scenarios.device_defaults
	$(PY) -m bench.scenarios.minatar --learner-device cuda cpu --clients $$(( $$(nproc) > 4 ? $$(nproc) - 2 : 2 ))

clean:
	rm -rf $(VENV) build *.egg-info

# The documentation site (mkdocs.yml; docs/development.md says why mkdocs) into build/docs/:
# strict, so a broken link, a missing page or a page outside the nav fails the build (not
# --quiet: it hides the warnings that strict mode counts, and the build passes). `make test`
# builds it before the tests.
.PHONY: docs docs-config readme-config
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d build/docs


# Regenerate docs/configuration.md's table from daemon/config.py (tests/unit/test_readme_config_table.py
# checks it is current); readme-config is its former name.
docs-config: $(STAMP)
	$(PY) -c "import re,pathlib; from rlinkd.daemon.config import docs_markdown as d; p=pathlib.Path('docs/configuration.md'); p.write_text(re.sub(r'<!-- config-table:start -->.*<!-- config-table:end -->', lambda m: '<!-- config-table:start -->\n'+d()+'<!-- config-table:end -->', p.read_text(), flags=re.S))"

readme-config: docs-config
