"""The one exception of the backend.

See docs/ARCHITECTURE.md §7 Backend and target.
"""


class BackendError(Exception):
    """A program cannot be compiled or run as asked (illegal vectorization, bad arrays, ...)."""
