"""Shared test helpers: `within`, which fails a test that would otherwise hang."""

import signal
from contextlib import contextmanager

import pytest


@pytest.fixture
def within():
    """`with within(seconds):` raises TimeoutError in the block once `seconds` have passed, so
    a loop that never ends fails its test instead of stalling the suite."""

    @contextmanager
    def limit(seconds: float):
        def expire(signum, frame):
            raise TimeoutError(f"still running after {seconds} s")

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    return limit
