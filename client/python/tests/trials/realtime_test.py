"""A Trial on a running job: it sees steps as they are committed,
wait_for_steps blocks on the collector's WatchSteps stream and returns when
the steps arrive, step states move from NOT_YET_AVAILABLE on, and the job's
end turns waits for missing steps into NoMoreData.

"Still blocked" is checked by a bounded join on the waiting thread; every
other wait is on a condition (an ack, a thread's end).
"""

import threading

import numpy as np
import pytest

from raw_ingest import Worker
from sonde.modes import ModeKeys
from sonde.trials import (
    InvalidWorker,
    NoMoreData,
    StepNotYetAvailable,
    StepState,
    StepUnavailable,
)

TRAIN, EVAL, GLOBAL = ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.GLOBAL
BLOCKED = 0.5  # seconds a waiter must stay blocked to count as blocked


class Background(threading.Thread):
    """Runs fn on its own thread and keeps its result or exception."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn = fn
        self.result = None
        self.error = None

    def run(self):
        try:
            self.result = self.fn()
        except BaseException as e:  # handed to the test
            self.error = e

    def finish(self, timeout=60):
        self.join(timeout)
        assert not self.is_alive(), "still running after {} s".format(timeout)
        if self.error is not None:
            raise self.error
        return self.result


def loss(step):
    return np.array(1.0 / (step + 1))


def started(collector, open_trial, job):
    """A worker that has committed step 0 of `job`, and a Trial on the job."""
    w = Worker(collector.address, job)
    w.step(0, {"loss": loss(0)})
    return w, open_trial(collector.address, job)


def test_wait_for_steps_blocks_until_the_step_is_committed(collector, open_trial):
    w, trial = started(collector, open_trial, "live")
    assert trial.has_passed_step(3) == StepState.NOT_YET_AVAILABLE
    calls = []
    unary = trial._conn.call
    trial._conn.call = lambda method, *args, **kwargs: calls.append(method) or unary(
        method, *args, **kwargs)
    waiter = Background(lambda: trial.wait_for_steps([3]))
    waiter.start()
    waiter.join(BLOCKED)
    assert waiter.is_alive()
    # It looked once (the job, then its steps) and now waits on the stream.
    assert calls == ["GetJob", "ListSteps"]
    w.step(1, {"loss": loss(1)})
    w.step(2, {"loss": loss(2)})
    waiter.join(BLOCKED)
    assert waiter.is_alive(), "returned before step 3 existed"
    w.step(3, {"loss": loss(3)})
    waiter.finish()
    assert trial.has_passed_step(3) == StepState.AVAILABLE
    assert trial.tensor("loss").value(3) == loss(3)
    w.end_job()


def test_a_trial_follows_a_job_that_keeps_streaming(collector, open_trial):
    w, trial = started(collector, open_trial, "streaming")
    go_on = threading.Event()

    def train():
        for step in range(1, 30):
            w.step(step, {"loss": loss(step), "w": np.full((2, 2), step, dtype=np.float32)})
            if step == 20:
                go_on.wait(60)  # hold the job open until the test has looked
        w.end_job()

    trainer = Background(train)
    trainer.start()
    trial.wait_for_steps([20])
    assert trial.steps()[:21] == list(range(21))
    assert trial.tensor("w").value(20).tolist() == [[20, 20], [20, 20]]
    assert not trial.training_ended()
    with pytest.raises(StepNotYetAvailable):
        trial.tensor("loss").value(25)
    go_on.set()
    trial.wait_for_steps([25, 29])
    trainer.finish()
    assert trial.steps() == list(range(30))
    with pytest.raises(NoMoreData) as e:
        trial.wait_for_steps([30])
    assert e.value.last_step == 29


def test_new_tensors_and_steps_show_without_a_new_trial(collector, open_trial):
    w = Worker(collector.address, "growing")
    w.step(0, {"a": loss(0)})
    trial = open_trial(collector.address, "growing")
    a = trial.tensor("a")
    assert trial.tensor_names() == ["a"] and a.steps() == [0]
    w.step(1, {"a": loss(1), "b": loss(1)})
    assert trial.tensor_names() == ["a", "b"]
    assert a.steps() == [0, 1] and trial.steps() == [0, 1]
    assert trial.tensor("b").value(1) == loss(1)
    w.end_job()


def test_a_skipped_step_turns_unavailable_once_a_later_step_is_stored(collector, open_trial):
    w, trial = started(collector, open_trial, "skips")
    assert trial.has_passed_step(0) == StepState.AVAILABLE
    assert trial.has_passed_step(1) == StepState.NOT_YET_AVAILABLE
    w.step(2, {"loss": loss(2)})
    assert trial.has_passed_step(1) == StepState.UNAVAILABLE
    assert trial.has_passed_step(2) == StepState.AVAILABLE
    assert trial.has_passed_step(3) == StepState.NOT_YET_AVAILABLE
    with pytest.raises(StepUnavailable):
        trial.wait_for_steps([1, 2])
    with pytest.raises(StepUnavailable):
        trial.tensor("loss").value(1)
    w.end_job()
    assert trial.has_passed_step(3) == StepState.UNAVAILABLE


def test_a_step_is_complete_when_every_worker_has_committed_it(collector, open_trial):
    w0 = Worker(collector.address, "two", worker=0, world_size=2)
    w1 = Worker(collector.address, "two", worker=1, world_size=2)
    w0.step(0, {"loss": loss(0), "only0": loss(0)})
    trial = open_trial(collector.address, "two")
    assert trial.steps() == []
    assert trial.steps(show_incomplete_steps=True) == [0]
    assert trial.has_passed_step(0) == StepState.NOT_YET_AVAILABLE
    assert trial.tensor("loss").value(0) == loss(0)  # worker 0's values are there
    with pytest.raises(StepNotYetAvailable):  # worker 1 may still save it
        trial.tensor("loss").value(0, worker=1)
    waiter = Background(lambda: trial.wait_for_steps([0]))
    waiter.start()
    waiter.join(BLOCKED)
    assert waiter.is_alive()
    w1.step(0, {"loss": loss(0) + 1})
    waiter.finish()
    assert trial.steps() == [0]
    assert trial.has_passed_step(0) == StepState.AVAILABLE
    assert trial.tensor("loss").workers(0) == [0, 1]
    assert trial.tensor("loss").value(0, worker=1) == loss(0) + 1
    with pytest.raises(InvalidWorker):  # complete now: never for worker 1
        trial.tensor("only0").value(0, worker=1)
    # Worker 0 runs ahead: step 1 waits for worker 1, then completes.
    w0.step(1, {"loss": loss(1)})
    assert trial.steps() == [0] and trial.last_complete_step == 0
    w1.step(1, {"loss": loss(1)})
    assert trial.steps() == [0, 1] and trial.last_complete_step == 1
    w0.end_job()
    w1.end_job()


def test_wait_for_mode_steps_while_other_modes_stream(collector, open_trial):
    w = Worker(collector.address, "modes")
    trial_steps = [(0, TRAIN, 0), (1, TRAIN, 1), (2, EVAL, 0), (3, TRAIN, 2), (4, EVAL, 1)]
    w.step(0, {"loss": loss(0)}, mode=TRAIN, mode_step=0)
    trial = open_trial(collector.address, "modes")
    assert trial.has_passed_step(0, mode=EVAL) == StepState.NOT_YET_AVAILABLE
    waiter = Background(lambda: trial.wait_for_steps([1], mode=EVAL))
    waiter.start()
    for step, mode, mode_step in trial_steps[1:4]:
        w.step(step, {"loss": loss(step)}, mode=mode, mode_step=mode_step)
    waiter.join(BLOCKED)
    assert waiter.is_alive(), "returned before EVAL step 1 existed"
    assert trial.has_passed_step(0, mode=EVAL) == StepState.AVAILABLE
    w.step(4, {"loss": loss(4)}, mode=EVAL, mode_step=1)
    waiter.finish()
    assert trial.steps(mode=EVAL) == [0, 1] and trial.steps(mode=TRAIN) == [0, 1, 2]
    assert trial.tensor("loss").value(1, mode=EVAL) == loss(4)
    w.end_job()
    with pytest.raises(NoMoreData) as e:
        trial.wait_for_steps([2], mode=EVAL)
    assert (e.value.mode, e.value.last_step) == (EVAL, 1)


def test_the_end_of_the_job_wakes_a_wait_with_no_more_data(collector, open_trial):
    w, trial = started(collector, open_trial, "ends")
    waiter = Background(lambda: trial.wait_for_steps([10]))
    waiter.start()
    w.step(1, {"loss": loss(1)})
    waiter.join(BLOCKED)
    assert waiter.is_alive()
    w.end_job()
    with pytest.raises(NoMoreData) as e:
        waiter.finish()
    assert (e.value.step, e.value.mode, e.value.last_step) == (10, GLOBAL, 1)


def test_a_wait_with_a_timeout_gives_up_with_step_not_yet_available(collector, open_trial):
    w, trial = started(collector, open_trial, "slow")
    with pytest.raises(StepNotYetAvailable) as e:
        trial.wait_for_steps([0, 5], timeout=0.3)
    assert e.value.step == 5
    w.end_job()


def test_a_disconnected_job_is_waited_for_not_declared_over(collector, open_trial):
    w, trial = started(collector, open_trial, "gone")
    w.close()  # the stream ends without a job end: the worker may come back
    assert not trial.training_ended()
    assert trial.has_passed_step(1) == StepState.NOT_YET_AVAILABLE
    with pytest.raises(StepNotYetAvailable):
        trial.wait_for_steps([1], timeout=1.5)
