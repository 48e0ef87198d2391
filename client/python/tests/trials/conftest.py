"""Fixtures of the sonde.trials tests."""

import pytest

from sonde.trials import create_trial


@pytest.fixture
def open_trial(start_collector):
    """create_trial whose trials are closed before the collectors stop (an
    open channel holds a collector's shutdown for its grace period)."""
    opened = []

    def open_(address, job, **kwargs):
        trial = create_trial(address, job, **kwargs)
        opened.append(trial)
        return trial

    yield open_
    for trial in opened:
        trial.close()
