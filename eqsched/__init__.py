"""eqsched: fast tensor loop programs by equality saturation over schedules.

See docs/ARCHITECTURE.md §2 Data flow.
"""

from pathlib import Path as _Path

# rules/ and extract/ are top-level folders of the repository, installed as eqsched.rules and
# eqsched.extract by setuptools' package-dir. When eqsched is imported from a source checkout
# (`python -m eqsched` in the repo root, PYTHONPATH=.), they sit beside this package instead.
_here = _Path(__file__).resolve().parent
if not (_here / "rules").is_dir() and (_here.parent / "rules" / "__init__.py").is_file():
    __path__.append(str(_here.parent))
