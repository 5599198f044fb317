"""nbgrader's configuration for this course, used by ``make student`` and ``make grade`` (instructor/*.py pass the
course folder, the kernel and the time limits on the command line; what stays the same lives here)."""
c = get_config()  # noqa: F821 (nbgrader provides it)

# Stubs that say what is missing: the test cell's checker reports a NotImplementedError as "still the stub".
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
# The student edition leaves code cells but not their outputs; the notebooks are stored without outputs anyway.
c.ClearOutput.enabled = True
c.Execute.interrupt_on_timeout = True
