"""`python -m eqsched` runs the `eqsched` command.

See docs/ARCHITECTURE.md §14 Layering.
"""

from .cli import main

raise SystemExit(main())
