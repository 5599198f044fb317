# Two commands for a fresh clone:  `make book`  builds the site,  `make test`  runs every test.
# Both create the virtual environment .venv/ when it is missing (or older than the files that define it).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Torch is installed first and pinned here, so an open `torch` requirement never pulls a multi-GB CUDA build on a
# CPU machine (the course's machines keep this exact CPU wheel on disk). On your own machine you may pick another:
#   make book TORCH=torch            (whatever PyPI serves your platform)
TORCH  ?= torch==2.13.0
JB_FLAGS := -W -n --keep-going
SITE   := _build/html
# `make test` reports the package's line coverage and fails below 95%.
COVERAGE := --cov=attention_course --cov-report=term-missing:skip-covered --cov-fail-under=95

.PHONY: book test venv clean help
help:
	@echo "make book   build the website into $(SITE) (executes every notebook; unchanged ones come from the cache)"
	@echo "make test   build the book warning-free, then run the unit, notebook and browser tests"
	@echo "            (browser tests: Chromium, e.g. apt-get install chromium; screenshots in _build/screenshots/)"
	@echo "make clean  remove _build/ (keeps .venv/)"

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --disable-pip-version-check -q "$(TORCH)"
	$(BIN)/python -m pip install --disable-pip-version-check -q -e ".[dev]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

# The first build also fetches the site's offline assets (MathJax, require.js, the widget manager) at pinned versions
# with npm into book/_vendor/ (book/_ext/offline_site.py; README, "Offline site"). `rm -rf book/_vendor` refetches.
book: venv _build/.package-stamp
	$(BIN)/jupyter-book build . $(JB_FLAGS)
	@echo
	@echo "The site is in $(SITE). To read it:  $(BIN)/python -m http.server -d $(SITE) 8000  then open http://127.0.0.1:8000"

# jupyter-cache keys a notebook's run on the notebook's own code alone, but the chapters print what the package
# computes and embed its widgets' front-end code: after any change to attention_course/, forget the cached runs so
# that no page shows outputs of an older package. (An unchanged rebuild still comes from the cache.)
_build/.package-stamp: $(shell find attention_course -name '*.py' -o -name '*.js' -o -name '*.css')
	rm -rf _build/.jupyter_cache
	mkdir -p _build && touch $@

test: book
	ATTENTION_COURSE_SITE=$(SITE) $(BIN)/python -m pytest $(COVERAGE)

clean:
	rm -rf _build
