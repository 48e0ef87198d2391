"""pytest plugin for Sonde's Python tests (loaded by run_pytest.sh).

Fixtures (on sonde.testing.Collector):
  collector: a real `sonde-collector` process from the runfiles, on a free
      loopback port and a fresh data directory; `collector.address`,
      `collector.restart()`, `collector.stop()`.
  start_collector: a factory, start_collector(rules="...", args=[...]), for
      tests that need several collectors or particular flags.
"""

import time
import os

import pytest

from sonde.testing import Collector, find_collector_binary  # noqa: F401 - for tests


def runfile(path):
    """Absolute path of a workspace-relative runfile."""
    root = os.environ.get("SONDE_RUNFILES") or os.getcwd()
    return os.path.join(root, path)


@pytest.fixture
def start_collector(tmp_path):
    started = []

    def start(rules="", args=(), name=None):
        c = Collector(tmp_path / (name or "db%d" % len(started)), rules=rules, args=args)
        started.append(c)
        return c

    yield start
    for c in started:
        c.stop()


@pytest.fixture
def collector(start_collector):
    return start_collector()


def wait_until(done, timeout=30.0):
    """True once done() holds; False if it still does not after `timeout`
    seconds. For state that changes elsewhere with nothing to wait on here
    (a hook's counters, files the collector writes): checks at once, then
    at growing intervals (1 ms doubling to 32 ms)."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while not done():
        now = time.monotonic()
        if now >= deadline:
            return False
        time.sleep(min(pause, deadline - now))
        pause = min(pause * 2, 0.032)
    return True
