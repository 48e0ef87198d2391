"""Trial: smdebug's analysis object over one job on a Sonde collector.

Every call asks the collector afresh (Query service), so a Trial on a
running job sees each step as soon as it is committed; nothing is cached.
wait_for_steps blocks on the collector's WatchSteps stream instead of
polling. A Trial holds only its channel and is safe to share between
threads.

Which steps count as complete: sonde/trials/steps.py.
"""

import datetime
import os
import re
import time

import grpc

from sonde.exceptions import (
    NoMoreData,
    QueryError,
    StepNotYetAvailable,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from sonde.modes import ModeKeys
from sonde.trials import profiler
from sonde.trials.connection import PAGE_SIZE, Connection, next_page_start
from sonde.trials.steps import Progress, StepList, StepState, as_mode, as_step, as_worker
from sonde.trials.tensor import Tensor
from sonde.v1 import query_pb2, rule_pb2, tensor_pb2

_RULE_STATUS = {
    rule_pb2.RULE_STATUS_IN_PROGRESS: "InProgress",
    rule_pb2.RULE_STATUS_ISSUES_FOUND: "IssuesFound",
    rule_pb2.RULE_STATUS_NO_ISSUES_FOUND: "NoIssuesFound",
    rule_pb2.RULE_STATUS_ERROR: "Error",
    rule_pb2.RULE_STATUS_STOPPED: "Stopped",
}

_JOB_STATUS = {
    query_pb2.JOB_STATUS_RUNNING: "Running",
    query_pb2.JOB_STATUS_FINISHED: "Finished",
    query_pb2.JOB_STATUS_STOPPED: "Stopped",
    query_pb2.JOB_STATUS_DISCONNECTED: "Disconnected",
    query_pb2.JOB_STATUS_PENDING: "Pending",
}

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def from_micros(micros):
    return _EPOCH + datetime.timedelta(microseconds=micros)


class Collection:
    """A collection as the saved tensors name it: its name and tensor names."""

    def __init__(self, name, tensor_names=()):
        self.name = name
        self.tensor_names = set(tensor_names)

    def __repr__(self):
        return "Collection(name={!r}, tensor_names={!r})".format(
            self.name, sorted(self.tensor_names))


class Trial:
    """smdebug's Trial over one job of a Sonde collector (see create_trial)."""

    def __init__(self, connection, job, name=None):
        self._conn = connection
        self.job = job
        self.name = name or job
        info = self._conn.call("GetJob", query_pb2.GetJobRequest(job=job), job=job)
        self._job_id = info.job_id

    def __repr__(self):
        return "<sonde.trials.Trial job={!r} collector={}>".format(self.job, self._conn.address)

    def close(self):
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- the job ----------------------------------------------------------

    def job_info(self):
        """The collector's JobInfo (sonde.v1.query_pb2.JobInfo) as it is now."""
        info = self._conn.call("GetJob", query_pb2.GetJobRequest(job=self.job), job=self.job)
        if info.job_id != self._job_id:
            raise QueryError(
                "job '{}' on {} was deleted and started anew (id {} is now {}): "
                "create a new trial".format(self.job, self._conn.address, self._job_id,
                                            info.job_id))
        return info

    def job_status(self):
        """'Running', 'Finished', 'Stopped' (by a rule), 'Disconnected' or 'Pending'."""
        return _JOB_STATUS.get(self.job_info().status, "Unknown")

    def training_ended(self):
        """True once the job has ended (every worker sent its job end, or a
        rule stopped it): no step will be added any more."""
        return Progress(self.job_info()).ended

    @property
    def loaded_all_steps(self):
        """smdebug's attribute: True once training has ended."""
        return self.training_ended()

    @property
    def last_complete_step(self):
        """The last global step no worker can add to any more (-1: none)."""
        info = self.job_info()
        progress = Progress(info)
        return info.last_step if progress.ended else progress.complete_through

    def workers(self):
        """Ranks of the workers that joined the job, sorted."""
        return sorted(self.job_info().workers)

    def modes(self):
        """Modes with saved steps (GLOBAL is not listed, as in smdebug)."""
        return sorted(ModeKeys(m.mode) for m in self.job_info().modes
                      if m.mode != tensor_pb2.MODE_GLOBAL and m.step_count > 0)

    # --- steps ------------------------------------------------------------

    def _steps(self, mode):
        wire = tensor_pb2.MODE_UNSPECIFIED if mode == ModeKeys.GLOBAL else int(mode)
        # In pages, so a long job's list never passes a message's limit.
        request = query_pb2.ListStepsRequest(job=self.job, mode=wire, max_steps=PAGE_SIZE)
        steps = []
        while True:
            response = self._conn.call("ListSteps", request, job=self.job)
            steps.extend(response.steps)
            if not response.truncated:
                return StepList(steps, mode)
            request.start_step = next_page_start("steps", self.job, response.steps,
                                                 request.start_step,
                                                 wire == tensor_pb2.MODE_UNSPECIFIED)

    def _snapshot(self, mode):
        # The job first, then its steps: a step committed in between shows
        # in the list but not yet in the job's progress, which can only make
        # a state more cautious (never UNAVAILABLE for a step being written).
        progress = Progress(self.job_info())
        return progress, self._steps(mode)

    def steps(self, mode=ModeKeys.GLOBAL, show_incomplete_steps=False):
        """Saved steps, sorted: global steps, or mode steps for a mode.

        Only complete steps (sonde/trials/steps.py) unless
        show_incomplete_steps.
        """
        mode = as_mode(mode)
        progress, steps = self._snapshot(mode)
        return [k for k in steps.keys
                if show_incomplete_steps or progress.final(steps.by_key[k].step)]

    def has_passed_step(self, step, mode=ModeKeys.GLOBAL):
        """StepState of the step (see sonde/trials/steps.py)."""
        return self._step_state(as_step(step), as_mode(mode))

    def global_step(self, mode, mode_step):
        """The global step of a mode step, None if it was not saved."""
        mode = as_mode(mode)
        if mode == ModeKeys.GLOBAL:
            return mode_step
        info = self._steps(mode).by_key.get(mode_step)
        return None if info is None else info.step

    def mode_modestep(self, global_step):
        info = self._steps(ModeKeys.GLOBAL).by_key.get(global_step)
        if info is None:
            return None, None
        return ModeKeys(info.mode), info.mode_step

    def mode(self, global_step):
        return self.mode_modestep(global_step)[0]

    def mode_step(self, global_step):
        return self.mode_modestep(global_step)[1]

    def wait_for_steps(self, required_steps, mode=ModeKeys.GLOBAL, timeout=None):
        """Blocks until every step in required_steps is AVAILABLE.

        Raises StepUnavailable for a step that was skipped, NoMoreData for
        one past the end of a job that has ended, and StepNotYetAvailable
        when `timeout` seconds (a Sonde addition; None: no limit) pass
        first.

        Wakes on the collector's WatchSteps stream: one look at the job and
        its steps, then one more per streamed step at or past the first
        missing one. A step the stream delivers counts as AVAILABLE even if
        a worker never committed it (the collector hands a step to its rules
        once it has waited --step_wait for a missing worker). While the job is not
        live on the collector (pending, or disconnected without a job end)
        the stream ends at once, and the wait looks again after 0.25 s,
        doubling up to 5 s.
        """
        mode = as_mode(mode)
        pending = sorted({as_step(s) for s in required_steps})
        deadline = None if timeout is None else time.monotonic() + timeout
        delivered = set()
        watch = None
        pause = 0.25
        try:
            while True:
                progress, steps = self._snapshot(mode)
                for step in list(pending):
                    state = steps.state(step, progress, delivered)
                    if state == StepState.AVAILABLE:
                        pending.remove(step)
                    elif state == StepState.UNAVAILABLE:
                        last = steps.keys[-1] if steps.keys else -1
                        if progress.ended and step > last:
                            raise NoMoreData(step, mode, last)
                        raise StepUnavailable(step, mode)
                if not pending:
                    return
                if watch is None:
                    # Steps up to complete_through cannot change any more;
                    # the stream replays the stored ones after it, then
                    # follows the job live.
                    request = query_pb2.WatchStepsRequest(
                        job=self.job, from_step=max(progress.complete_through + 1, 0))
                    watch = self._conn.stream("WatchSteps", request, job=self.job,
                                              timeout=_remaining(deadline))
                if not _next_relevant(watch, mode, pending[0], delivered):
                    # The stream ends when the job is no longer live here:
                    # ended (the next look settles every step), or
                    # disconnected, when a worker may still come back.
                    watch.close()
                    watch = None
                    if not self.training_ended():
                        if deadline is not None and time.monotonic() + pause >= deadline:
                            raise StepNotYetAvailable(pending[0], mode)
                        time.sleep(pause)
                        pause = min(pause * 2, 5.0)
        except QueryError as e:
            if deadline is not None and e.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise StepNotYetAvailable(pending[0], mode) from None
            raise
        finally:
            if watch is not None:
                watch.close()

    # --- tensors ----------------------------------------------------------

    def _tensor_infos(self, collection=None):
        # In pages, so a job with many names never passes a message's limit;
        # names come in byte order, each page after the last one's name.
        request = query_pb2.ListTensorsRequest(job=self.job, collection=collection or "",
                                               max_tensors=PAGE_SIZE)
        tensors = []
        while True:
            response = self._conn.call("ListTensors", request, job=self.job)
            tensors.extend(response.tensors)
            if not response.truncated:
                return tensors
            if not response.tensors or response.tensors[-1].name <= request.start_after:
                raise QueryError("the collector cut its answer of tensor names of job '{}' "
                                 "after '{}' without going past it"
                                 .format(self.job, request.start_after))
            request.start_after = response.tensors[-1].name

    def tensor_names(self, *, step=None, mode=ModeKeys.GLOBAL, regex=None, collection=None):
        """Names of saved tensors, sorted.

        regex: a Python regular expression (or a list of them) searched
        anywhere in the name, as smdebug does. collection: a name or a
        Collection. step: only tensors saved at that step (a mode step when
        a mode is given); mode alone: tensors saved in that mode. Given
        together, the filters intersect.
        """
        mode = as_mode(mode)
        if collection is not None and not isinstance(collection, str):
            collection = collection.name
        names = sorted(t.name for t in self._tensor_infos(collection))
        if regex is not None:
            patterns = [re.compile(r) for r in ([regex] if isinstance(regex, str) else regex)]
            names = [n for n in names if any(p.search(n) for p in patterns)]
        if step is None and mode == ModeKeys.GLOBAL:
            return names
        step = None if step is None else as_step(step)
        # One ReadSeries per candidate: ListTensors has no step or mode filter.
        return [n for n in names if Tensor(n, self)._saved_at(step, mode)]

    def tensors(self, **filters):
        """tensor_names(**filters), by the older smdebug name."""
        return self.tensor_names(**filters)

    def has_tensor(self, tname):
        return any(t.name == tname for t in self._tensor_infos())

    def tensor(self, tname):
        """The Tensor of that name; TensorUnavailable if it was never saved."""
        if not self.has_tensor(tname):
            raise TensorUnavailable(tname)
        return Tensor(tname, self)

    def collections(self):
        """dict name -> Collection of every collection the saved tensors name."""
        out = {}
        for t in self._tensor_infos():
            for c in t.collections:
                out.setdefault(c, Collection(c)).tensor_names.add(t.name)
        return out

    def collection(self, coll_name):
        collections = self.collections()
        if coll_name not in collections:
            raise KeyError("no saved tensor of job '{}' is in collection '{}'".format(
                self.job, coll_name))
        return collections[coll_name]

    # --- step states for Tensor --------------------------------------------

    def _step_state(self, step, mode):
        progress, steps = self._snapshot(mode)
        return steps.state(step, progress)

    def _missing(self, tname, step, mode):
        """The exception for a tensor that has no record at (step, mode)."""
        state = self._step_state(step, mode)
        if state == StepState.AVAILABLE:
            return TensorUnavailableForStep(tname, step, mode)
        if state == StepState.UNAVAILABLE:
            return StepUnavailable(step, mode)
        return StepNotYetAvailable(step, mode)

    def _progress(self):
        return Progress(self.job_info())

    # --- profiler ---------------------------------------------------------

    def metric_names(self, worker=None, regex=None):
        """{worker: [metric names, sorted]} of the profiler's system metrics
        (e.g. "cpu.util_percent", "gpu.0.memory_used_bytes"; docs/profiler.md).

        worker: only that rank (or "worker_<rank>"). regex: a Python regular
        expression (or a list of them) searched in the name, as in
        tensor_names. Workers with no such metric are left out.
        """
        return profiler.metric_names(self._conn, self.job, as_worker(worker), regex)

    def system_metrics(self, names=None, regex=None, worker=None, start=None, end=None, *,
                       page_size=None):
        """{(worker, name): MetricSeries(times, values)} of the metrics named
        in `names` (a name or a list) or where `regex` (Python's re.search,
        a pattern or a list) finds a match; neither: every metric. Only
        series with points in [start, end) are returned.

        times are numpy datetime64[us] in UTC (`.astype("int64")`: unix
        microseconds), values float64. start and end: unix microseconds, a
        numpy.datetime64, an aware datetime or an RFC3339 string; None: no
        bound. Reads past the collector's per-call limit (page_size points a
        call; None: the collector's 200000) until the range is exhausted
        (sonde/trials/profiler.py says how).
        """
        return profiler.read_metrics(self._conn, self.job, names, regex, as_worker(worker),
                                     start, end, page_size)

    def framework_events(self, kind=None, name=None, worker=None, start=None, end=None, *,
                         page_size=None):
        """[FrameworkEvent] that start in [start, end), sorted by start time.

        kind: "step", "data_wait", "forward", "backward", "span" or "init"
        (None: every kind); name: only events of that name (spans). Each
        FrameworkEvent has kind, name, worker, mode (ModeKeys or None),
        step (global; -1 outside a step), mode_step, start and end
        (datetime64[us], UTC) and duration (timedelta64[us]). Times as for
        system_metrics; reads past the collector's per-call limit
        (page_size events a call; None: the collector's 100000).
        """
        def workers():
            return sorted(set(self.job_info().workers) | set(self.metric_names()))

        return profiler.read_events(self._conn, self.job, workers, kind, name, as_worker(worker),
                                    start, end, page_size)

    # --- rules ------------------------------------------------------------

    def _rule_results(self):
        request = query_pb2.GetRuleResultsRequest(job=self.job)
        return self._conn.call("GetRuleResults", request, job=self.job).results

    def rule_results(self):
        """Every rule's latest result for the job, as dicts (the keys of
        `sonde rules --json`; `time` is a UTC datetime, `mode` a ModeKeys or
        None)."""
        out = []
        for r in self._rule_results():
            out.append({
                "job": r.job,
                "rule": r.rule,
                "rule_type": r.rule_type,
                "status": _RULE_STATUS.get(r.status, "Unknown"),
                "step": r.step,
                "mode": ModeKeys(r.mode) if r.mode in tuple(ModeKeys) else None,
                "mode_step": r.mode_step,
                "worker": r.worker,
                "tensors": list(r.tensors),
                "message": r.message,
                "suggestion": r.suggestion,
                "observed": r.observed,
                "threshold": r.threshold,
                "steps_evaluated": r.steps_evaluated,
                "datapoints": r.datapoints,
                "times_triggered": r.times_triggered,
                "actions_taken": list(r.actions_taken),
                "time": from_micros(r.updated_unix_micros),
            })
        return out

    def report(self):
        """The job's self-contained HTML report (docs/profiler.md, "Report"),
        as a str: the page `sonde report` writes."""
        return self._conn.call("GetReport", query_pb2.GetReportRequest(job=self.job),
                               job=self.job).html

    def rule_job_summary(self):
        """The rules' state shaped like SageMaker's estimator.rule_job_summary()."""
        out = []
        for r in self._rule_results():
            status = _RULE_STATUS.get(r.status, "Unknown")
            details = r.message
            if r.status == rule_pb2.RULE_STATUS_ISSUES_FOUND:
                details = ("RuleEvaluationConditionMet: Evaluation of the rule {} at step {} "
                           "resulted in the condition being met: {}".format(r.rule, r.step,
                                                                           r.message))
            out.append({
                "RuleConfigurationName": r.rule,
                "RuleEvaluationStatus": status,
                "StatusDetails": details,
                "LastModifiedTime": from_micros(r.updated_unix_micros),
            })
        return out


def _remaining(deadline):
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def _next_relevant(watch, mode, first_pending, delivered):
    """Reads the watch up to a step that may settle a pending one; False
    when the stream ends first. Notes each step seen in `delivered` (the
    collector hands a step on once it is complete)."""
    for completed in watch:
        if mode == ModeKeys.GLOBAL:
            delivered.add(completed.step)
            if completed.step >= first_pending:
                return True
        elif completed.mode == int(mode):
            delivered.add(completed.mode_step)
            if completed.mode_step >= first_pending:
                return True
    return False


def create_trial(address, job, name=None, *, token=None, root_certificates=None,
                 certificate_chain=None, private_key=None, server_name=None, timeout=30.0):
    """A Trial over `job` on the collector at `address` ("host:port").

    token: bearer token (default: $SONDE_TOKEN, if set). root_certificates:
    the CA to trust, as PEM bytes or a file path; given, the channel uses
    TLS. certificate_chain and private_key: a client certificate for mutual
    TLS. server_name: the name to check the collector's certificate against
    instead of the address's host. timeout: seconds for each call.

    Raises JobNotFound for an unknown job, CollectorUnavailable when the
    collector cannot be reached, QueryError for other refusals (e.g.
    UNAUTHENTICATED), with the collector's message.
    """
    if token is None:
        token = os.environ.get("SONDE_TOKEN") or None
    connection = Connection(address, token=token, root_certificates=root_certificates,
                            certificate_chain=certificate_chain, private_key=private_key,
                            server_name=server_name, timeout=timeout)
    try:
        return Trial(connection, job, name=name)
    except BaseException:
        connection.close()
        raise
