"""`python -m eqsched` and the `eqsched` command: `run` imports the command line and runs it.

Importing the command line takes a second or more (egglog, LLVM, numpy, the rules). A Ctrl-C
meanwhile was Python's KeyboardInterrupt traceback from deep inside some import; `run` makes it
the command's own "interrupted" (exit status 130), as after the imports.

See docs/ARCHITECTURE.md §14 Layering.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

EXIT_INTERRUPTED = 130


def run() -> int:
    """Import `eqsched.cli` and run its `main` on the command's arguments."""
    # Only where Ctrl-C is Python's KeyboardInterrupt (one ignored, as in a background job,
    # stays so) and where handlers can be set (the main thread).
    guard = (threading.current_thread() is threading.main_thread()
             and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    if guard:
        signal.signal(signal.SIGINT, _interrupted_while_starting)
    from .cli import main

    if guard:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return main()


def _interrupted_while_starting(signum: int, frame: Any) -> None:
    print("\neqsched: interrupted", file=sys.stderr)
    raise SystemExit(EXIT_INTERRUPTED)  # unwinds the imports without a traceback


if __name__ == "__main__":
    raise SystemExit(run())
