"""A notebook whose execution failed is read, and so executed, again by the next build.

Sphinx reads again only the documents whose source changed since its saved environment. A notebook that failed to
execute (an error in a cell, a timeout, a package that changed under it) keeps its source: without this extension
the next build would take the saved doctree of the failed run, with the traceback in it, raise no error and publish
that page. myst-nb records each document's execution in the environment (``succeeded``) and caches only successful
runs, so listing the failed documents as outdated makes the next build execute them again, and fail again unless
the cause is gone. tests/test_built_pages.py reads every built page for outputs of errors, in case one slips past.
"""
from __future__ import annotations

from myst_nb.sphinx_ import NbMetadataCollector
from sphinx.util import logging

LOGGER = logging.getLogger(__name__)


def failed_documents(env) -> list[str]:
    """The documents whose last execution did not succeed, by the environment's own record."""
    return sorted(doc for doc in env.found_docs if doc in NbMetadataCollector.get_doc_data(env)
                  and (NbMetadataCollector.get_exec_data(env, doc) or {}).get("succeeded") is False)


def read_failed_again(app, env, added, changed, removed) -> list[str]:
    failed = [doc for doc in failed_documents(env) if doc not in changed and doc not in added]
    if failed:
        LOGGER.info("executing again, as their last run failed: %s", ", ".join(failed))
    return failed


def setup(app):
    app.connect("env-get-outdated", read_failed_again)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
