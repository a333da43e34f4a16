"""eqsched: fast tensor loop programs by equality saturation over schedules.

See docs/ARCHITECTURE.md §2 Data flow.
"""

# eqsched.rules and eqsched.extract are the repository's top-level rules/ and extract/: here
# through the committed symlinks eqsched/rules -> ../rules and eqsched/extract -> ../extract,
# in a wheel as plain subpackages (pyproject's package-dir). See docs/ARCHITECTURE.md §16.
