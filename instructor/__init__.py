"""Tools for instructors: the student edition (``make student``) and grading with nbgrader (``make grade``).

Not part of the ``attention_course`` package that learners install: these run on the instructor's machine, from
a clone of the repository. ``exercises`` reads the chapters' exercises from the notebooks (the one source of both
editions); ``student`` builds the student edition; ``grade`` grades a folder of submissions; ``leaks`` finds
solution text in a built edition. The guide is ``book/instructors.md``.
"""
