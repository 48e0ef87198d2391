"""Step numbers, modes and step states shared by Trial and Tensor.

When is a step complete? As in smdebug, a step is AVAILABLE once no worker
can add to it any more: every worker of the job (ranks below its
world_size) has committed that step or a later one, or the job has ended.
A step not stored is UNAVAILABLE once every worker has passed it (for a
mode step: a later step of that mode is stored and complete) or the job has
ended; otherwise it is NOT_YET_AVAILABLE. With one worker this reads:
available if stored, unavailable if a later step is stored or the job has
ended.
"""

import bisect
import enum
import operator

from sonde.exceptions import InvalidWorker
from sonde.modes import ModeKeys
from sonde.v1 import query_pb2

_ENDED = (query_pb2.JOB_STATUS_FINISHED, query_pb2.JOB_STATUS_STOPPED)


class StepState(enum.Enum):
    """smdebug's StepState (smdebug.core.tensor)."""

    UNAVAILABLE = 0
    AVAILABLE = 1
    NOT_YET_AVAILABLE = 2


def as_mode(mode):
    """ModeKeys from a ModeKeys, its number, or None (GLOBAL)."""
    if mode is None:
        return ModeKeys.GLOBAL
    try:
        return ModeKeys(mode)
    except ValueError:
        raise ValueError("unknown mode {!r}; use sonde.modes.TRAIN, EVAL, PREDICT or GLOBAL"
                         .format(mode)) from None


def as_step(step):
    """An int >= 0 from an int-like step (numpy integers included)."""
    try:
        if isinstance(step, bool):
            raise TypeError
        value = operator.index(step)
    except TypeError:
        value = -1
    if value < 0:
        raise ValueError("a step is an integer >= 0, got {!r}".format(step))
    return value


class Progress:
    """What one JobInfo says about which steps can still change."""

    def __init__(self, job):
        self.ended = job.status in _ENDED
        ranks = set(range(max(job.world_size, 1))) | set(job.workers)
        last = dict(job.worker_last_step)
        # Every worker has committed this global step or a later one.
        self.complete_through = min(last.get(r, -1) for r in ranks)

    def final(self, global_step):
        return self.ended or global_step <= self.complete_through


class StepList:
    """ListSteps of one mode, by the step number that mode uses."""

    def __init__(self, infos, mode):
        self.mode = mode
        key = (lambda i: i.step) if mode == ModeKeys.GLOBAL else (lambda i: i.mode_step)
        self.by_key = {key(i): i for i in infos}
        self.keys = sorted(self.by_key)

    def state(self, step, progress, delivered=()):
        info = self.by_key.get(step)
        if info is not None:
            if progress.final(info.step) or step in delivered:
                return StepState.AVAILABLE
            return StepState.NOT_YET_AVAILABLE
        if progress.ended:
            return StepState.UNAVAILABLE
        if self.mode == ModeKeys.GLOBAL:
            if progress.complete_through > step:
                return StepState.UNAVAILABLE
        else:
            later = bisect.bisect_right(self.keys, step)
            if later < len(self.keys) and progress.final(self.by_key[self.keys[later]].step):
                return StepState.UNAVAILABLE
        return StepState.NOT_YET_AVAILABLE


def as_worker(worker):
    """None or a rank, from a rank or smdebug's 'worker_<rank>'."""
    if worker is None:
        return None
    if isinstance(worker, str) and worker.startswith("worker_") and worker[7:].isdigit():
        return int(worker[7:])
    if isinstance(worker, int) and not isinstance(worker, bool) and worker >= 0:
        return worker
    raise InvalidWorker(worker)
