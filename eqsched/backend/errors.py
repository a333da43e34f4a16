"""The one exception of the backend."""


class BackendError(Exception):
    """A program cannot be compiled or run as asked (illegal vectorization, bad arrays, ...)."""
