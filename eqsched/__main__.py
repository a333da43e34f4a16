"""`python -m eqsched` runs the `eqsched` command."""

from .cli import main

raise SystemExit(main())
