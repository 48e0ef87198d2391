"""Tensor: smdebug's per-tensor API over the Query service.

Steps are global steps by default, mode steps when a mode is given (as in
smdebug). A worker is a rank (int); smdebug's "worker_<rank>" names are
accepted too. With worker=None the lowest rank that saved the tensor at
that step answers, as smdebug takes the first worker.
"""

import grpc

from sonde.exceptions import (
    InvalidWorker,
    QueryError,
    StepNotYetAvailable,
    TensorUnavailableForStep,
)
from sonde.modes import ModeKeys
from sonde.trials import reductions
from sonde.trials.connection import PAGE_SIZE, next_page_start
from sonde.trials.steps import StepState, as_mode, as_step, as_worker
from sonde.trials.values import assemble, decode
from sonde.v1 import query_pb2, tensor_pb2


class Tensor:
    def __init__(self, name, trial):
        self.name = name
        self.trial = trial

    def __repr__(self):
        return "<sonde.trials.Tensor {!r} of job {!r}>".format(self.name, self.trial.job)

    # --- where the tensor was saved ----------------------------------------

    def _series(self, mode, step=None):
        """Statistics points of every worker, at one step or all of them
        (the wire counts global steps for GLOBAL, mode steps otherwise)."""
        wire = tensor_pb2.MODE_UNSPECIFIED if mode == ModeKeys.GLOBAL else int(mode)
        request = query_pb2.ReadSeriesRequest(job=self.trial.job, tensor=self.name, mode=wire,
                                              worker=-1)
        if step is not None:
            request.start_step = step
            request.end_step = step + 1
        # In pages, so a long series never passes a message's limit; each
        # page ends between steps, the next starts after its last one.
        request.max_points = PAGE_SIZE
        points = []
        while True:
            response = self.trial._conn.call("ReadSeries", request, job=self.trial.job)
            points.extend(response.points)
            if not response.truncated:
                return points
            request.start_step = next_page_start(
                "series points", self.trial.job, response.points, request.start_step,
                wire == tensor_pb2.MODE_UNSPECIFIED)

    def _saved_at(self, step, mode):
        """Whether any worker saved the tensor at the step (any step: None)."""
        return len(self._series(mode, step)) > 0

    def steps(self, mode=ModeKeys.GLOBAL, show_incomplete_steps=False):
        """Steps at which the tensor was saved, sorted (complete ones only,
        unless show_incomplete_steps)."""
        mode = as_mode(mode)
        progress = self.trial._progress()
        out = set()
        for p in self._series(mode):
            if show_incomplete_steps or progress.final(p.step):
                out.add(p.step if mode == ModeKeys.GLOBAL else p.mode_step)
        return sorted(out)

    def workers(self, step_num, mode=ModeKeys.GLOBAL):
        """Ranks that saved the tensor at the step, sorted."""
        mode, step = as_mode(mode), as_step(step_num)
        workers = sorted({p.worker for p in self._series(mode, step)})
        if not workers:
            raise TensorUnavailableForStep(self.name, step, mode)
        return workers

    def prev_steps(self, step, n=None, mode=ModeKeys.GLOBAL):
        """Up to n saved steps of the mode, ending with `step` if saved."""
        previous = [s for s in self.steps(mode=mode) if s <= step]
        return previous[-n:] if n else previous

    # --- values ------------------------------------------------------------

    def _read(self, step, mode, worker):
        request = query_pb2.ReadTensorRequest(job=self.trial.job, tensor=self.name, step=step,
                                              mode=int(mode), worker=worker)
        chunks = self.trial._conn.stream("ReadTensor", request, job=self.trial.job,
                                         timeout=self.trial._conn.timeout)
        try:
            assembled = assemble(chunks)
        except QueryError as e:
            if e.code == grpc.StatusCode.FAILED_PRECONDITION:  # saved as statistics only
                raise TensorUnavailableForStep(self.name, step, mode, has_reductions=True) from None
            raise
        finally:
            chunks.close()
        if assembled is None:
            raise QueryError("ReadTensor of '{}' at {} step {} of worker {} sent no data".format(
                self.name, mode.name, step, worker))
        header, data = assembled
        return decode(data, header.dtype, header.shape)

    def value(self, step_num, mode=ModeKeys.GLOBAL, worker=None):
        """The values saved at the step, as a numpy array of the saved dtype
        and shape (bfloat16 as float32)."""
        mode, step, rank = as_mode(mode), as_step(step_num), as_worker(worker)
        try:
            # Rank 0 first: it is the answer for worker=None whenever it
            # saved the tensor, and then one call is enough.
            return self._read(step, mode, 0 if rank is None else rank)
        except QueryError as e:
            if e.code != grpc.StatusCode.NOT_FOUND:
                raise
        workers = sorted({p.worker for p in self._series(mode, step)})
        if not workers:
            raise self.trial._missing(self.name, step, mode)
        if rank is not None and rank not in workers:
            # smdebug says InvalidWorker; while the step can still grow, the
            # worker may yet save the tensor there.
            if self.trial._step_state(step, mode) == StepState.NOT_YET_AVAILABLE:
                raise StepNotYetAvailable(step, mode)
            raise InvalidWorker(worker)
        return self._read(step, mode, workers[0] if rank is None else rank)

    def step(self, step_num, mode=ModeKeys.GLOBAL, worker=None):
        """The tensor at one step, in the older smdebug style
        (`tensor.step(s).value`): nothing is read until asked for."""
        return TensorStep(self, step_num, mode, worker)

    def values(self, mode=ModeKeys.GLOBAL, worker=None):
        """dict step -> value for every complete step of the mode."""
        return {s: self.value(s, mode=mode, worker=worker) for s in self.steps(mode=mode)}

    # --- reductions --------------------------------------------------------

    def _statistics(self, step, mode, worker):
        points = self._series(mode, step)
        if not points:
            raise self.trial._missing(self.name, step, mode)
        if worker is None:
            return min(points, key=lambda p: p.worker).statistics
        for p in points:
            if p.worker == worker:
                return p.statistics
        raise InvalidWorker(worker)

    def reduction_value(self, step_num, reduction_name, mode=ModeKeys.GLOBAL, worker=None,
                        abs=False):
        """One of smdebug's reductions (min, max, mean, std, variance, sum,
        prod, l1, l2; of the absolute values with abs=True): computed from
        the values when they were saved, else from the stored statistics
        (every reduction but prod; see sonde.trials.reductions)."""
        reductions.check_name(reduction_name)
        mode, step = as_mode(mode), as_step(step_num)
        try:
            return reductions.from_values(reduction_name, self.value(step, mode, worker), abs)
        except TensorUnavailableForStep as e:
            if not e.has_reductions:
                raise
        value = reductions.from_statistics(
            reduction_name, self._statistics(step, mode, as_worker(worker)), abs)
        if value is None:
            raise TensorUnavailableForStep(self.name, step, mode, has_reductions=True)
        return value

    def reduction_values(self, step_num, mode=ModeKeys.GLOBAL, worker=None):
        """dict (reduction_name, abs) -> value of every reduction the stored
        statistics answer (the collector keeps statistics of every tensor,
        so these exist whether or not values were saved)."""
        mode, step = as_mode(mode), as_step(step_num)
        stats = self._statistics(step, mode, as_worker(worker))
        return {(name, abs_): reductions.from_statistics(name, stats, abs_)
                for name in reductions.FROM_STATISTICS for abs_ in (False, True)
                if stats.count > 0 or name not in ("min", "max")}


class TensorStep:
    """One step of a Tensor (`Tensor.step`): `value` and the reductions,
    read when asked for, with the step's mode and worker."""

    def __init__(self, tensor, step_num, mode, worker):
        self.tensor = tensor
        self.step_num = as_step(step_num)
        self.mode = as_mode(mode)
        self.worker = worker

    def __repr__(self):
        return "<sonde.trials.TensorStep {!r} at {} step {}>".format(
            self.tensor.name, self.mode.name, self.step_num)

    @property
    def value(self):
        return self.tensor.value(self.step_num, mode=self.mode, worker=self.worker)

    def reduction_value(self, reduction_name, abs=False):
        return self.tensor.reduction_value(self.step_num, reduction_name, mode=self.mode,
                                           worker=self.worker, abs=abs)

    def reduction_values(self):
        return self.tensor.reduction_values(self.step_num, mode=self.mode, worker=self.worker)
