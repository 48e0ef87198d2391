"""A job's profiler data (docs/profiler.md): system metrics and framework
events, read with the Query service's ListMetrics, ReadMetrics and
ReadEvents. Trial.metric_names, Trial.system_metrics and
Trial.framework_events are the public face; this module does the reading.

Times. Every time returned is a numpy datetime64[us] in UTC (numpy's
datetimes carry no zone; these are UTC), so `.astype("int64")` gives unix
microseconds, the collector's unit, exactly; durations are timedelta64[us].
A time given (start, end) may be an int of unix microseconds, a
numpy.datetime64, an aware datetime.datetime, or an RFC3339 string with a
zone ("2024-05-01T12:00:00Z"); a naive datetime is refused, its zone would
be a guess. Ranges are [start, end), as the collector's.

Reading everything. The collector answers each call with one message, so it
stops at a limit (200000 points, 100000 events, or `page_size`, and about
3 MiB whatever the count) and says the answer was truncated. These functions read on until the range is
exhausted, without gaps or repeats:

- Metrics come by worker, then metric, then time, so only the last series
  of an answer can be cut. It is read on alone from the microsecond after
  its last point (a series holds at most one point per microsecond), then
  the metrics after it, one worker at a time.
- Events come by worker, kind, name, then start. A truncated answer is
  narrowed to one worker, then to one kind. One (worker, kind, name) group
  comes in (start, end) order and is read on from the last start seen,
  dropping the events at that start already read (events of a group differ
  in start or end). A kind read without a name can hold several names
  (spans), so its time range is split at the last start seen and each part
  read again.

On a running job each call sees the data stored at that moment.
"""

import collections
import datetime
import operator
import re

import numpy as np

from sonde.exceptions import QueryError
from sonde.modes import ModeKeys
from sonde.v1 import profile_pb2, query_pb2

_Kind = profile_pb2.TraceEvent

# The CLI's spellings (client/format.h), in the wire's order.
KINDS = {
    "step": _Kind.KIND_STEP,
    "data_wait": _Kind.KIND_DATA_WAIT,
    "forward": _Kind.KIND_FORWARD,
    "backward": _Kind.KIND_BACKWARD,
    "span": _Kind.KIND_SPAN,
    "init": _Kind.KIND_INIT,
}
_KIND_NAMES = {value: name for name, value in KINDS.items()}

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_MICROSECOND = datetime.timedelta(microseconds=1)


class MetricSeries(collections.namedtuple("MetricSeries", ["times", "values"])):
    """One worker's series of one metric: `times` (datetime64[us], UTC,
    increasing) and `values` (float64), of equal length."""

    __slots__ = ()


class FrameworkEvent(collections.namedtuple(
        "FrameworkEvent",
        ["kind", "name", "worker", "mode", "step", "mode_step", "start", "end", "duration"])):
    """One framework event. kind: "step", "data_wait", "forward",
    "backward", "span" or "init"; name: the span's name ("" for the other
    kinds); worker: the rank; mode: a ModeKeys, or None when unset; step:
    the global step it happened in (-1: outside a step) and mode_step the
    step within its mode; start and end: datetime64[us] (UTC); duration:
    end - start, a timedelta64[us]."""

    __slots__ = ()


def as_micros(value, what):
    """Unix microseconds from a time given by a user (see the module's
    docstring); None stays None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError("{} must be a time, got {!r}".format(what, value))
    if isinstance(value, np.datetime64):
        if np.isnat(value):
            raise ValueError("{} is NaT".format(what))
        return int(value.astype("datetime64[us]").astype(np.int64))
    if isinstance(value, str):
        text = value.strip()
        if text[-1:] in ("Z", "z"):
            text = text[:-1] + "+00:00"
        try:
            parsed = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise ValueError("{} '{}' is not an RFC3339 time such as 2024-05-01T12:00:00Z"
                             .format(what, value)) from None
        if parsed.utcoffset() is None:
            raise ValueError("{} '{}' has no zone: add Z or an offset such as +02:00"
                             .format(what, value))
        value = parsed
    if isinstance(value, datetime.datetime):
        if value.utcoffset() is None:
            raise ValueError("{} {!r} is a naive datetime: give it a tzinfo "
                             "(e.g. datetime.timezone.utc)".format(what, value))
        return (value - _EPOCH) // _MICROSECOND
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError("{} must be unix microseconds (int), a numpy.datetime64, an aware "
                        "datetime or an RFC3339 string, got {!r}".format(what, value)) from None


def time_range(start, end):
    """(start, end) in unix microseconds for the wire: start 0 is "from the
    beginning", end 0 "no end"."""
    start_us = as_micros(start, "start")
    end_us = as_micros(end, "end")
    if start_us is not None and start_us < 0:
        raise ValueError("start must not be before 1970, got {!r}".format(start))
    if end_us is not None and end_us <= (start_us or 0):
        raise ValueError("end ({!r}) must be after start ({!r})".format(end, start))
    return start_us or 0, end_us or 0


def as_kind(kind):
    """The wire's kind from a name ("step", ...) or the wire's number; None
    is every kind."""
    if kind is None:
        return _Kind.KIND_UNSPECIFIED
    if isinstance(kind, str) and kind.lower() in KINDS:
        return KINDS[kind.lower()]
    if isinstance(kind, int) and not isinstance(kind, bool) and kind in _KIND_NAMES:
        return kind
    raise ValueError("unknown event kind {!r}: use {}".format(kind, ", ".join(KINDS)))


def as_page_size(page_size):
    if page_size is None:
        return 0
    size = operator.index(page_size)
    if size < 1:
        raise ValueError("page_size must be >= 1 (None: the collector's limit), got {!r}"
                         .format(page_size))
    return size


def _patterns(regex):
    if regex is None:
        return None
    return [re.compile(r) for r in ([regex] if isinstance(regex, str) else regex)]


def metric_names(conn, job, worker=None, regex=None):
    """{worker: [metric names, sorted]} (see Trial.metric_names)."""
    response = conn.call("ListMetrics", query_pb2.ListMetricsRequest(job=job), job=job)
    patterns = _patterns(regex)
    out = {}
    for w in response.workers:
        if worker is not None and w.worker != worker:
            continue
        names = [n for n in w.names if patterns is None or any(p.search(n) for p in patterns)]
        if names:
            out[w.worker] = names
    return out


def read_metrics(conn, job, names=None, regex=None, worker=None, start=None, end=None,
                 page_size=None):
    """{(worker, name): MetricSeries} (see Trial.system_metrics)."""
    start_us, end_us = time_range(start, end)
    max_points = as_page_size(page_size)
    wanted_names = None if names is None else set([names] if isinstance(names, str) else names)
    patterns = _patterns(regex)

    def selected(name):
        if wanted_names is None and patterns is None:
            return True
        return ((wanted_names is not None and name in wanted_names) or
                (patterns is not None and any(p.search(name) for p in patterns)))

    # The series to read, in the collector's order: by worker, then name
    # (Python orders str as the store orders their UTF-8 bytes).
    keys = sorted((w, n) for w, ns in metric_names(conn, job, worker).items()
                  for n in ns if selected(n))
    if not keys:
        return {}
    parts = {}

    def call(w, series_names, since):
        request = query_pb2.ReadMetricsRequest(
            job=job, names=series_names, worker=w, start_unix_micros=since,
            end_unix_micros=end_us, max_points=max_points)
        response = conn.call("ReadMetrics", request, job=job)
        for s in response.series:
            if len(s.unix_micros):
                times, values = parts.setdefault((s.worker, s.name), ([], []))
                times.append(np.array(s.unix_micros, dtype=np.int64))
                values.append(np.array(s.values, dtype=np.float64))
        return response

    def read_on_last_series(response):
        """Reads the rest of a truncated answer's last series; its key."""
        if not response.series:
            raise QueryError("ReadMetrics of job '{}' was truncated without a series"
                             .format(job))
        last = response.series[-1]
        key = (last.worker, last.name)
        if not len(last.unix_micros):
            # A series with no point in the range is sent whole: the limit
            # was reached at the start of the next one.
            return key
        while response.truncated:
            since = response.series[-1].unix_micros[-1] + 1
            response = call(key[0], [key[1]], since)
            if response.truncated and (not response.series or
                                       not len(response.series[-1].unix_micros)):
                raise QueryError("ReadMetrics of job '{}' was truncated without a point"
                                 .format(job))
        return key

    response = call(-1 if worker is None else worker, sorted({n for _, n in keys}), start_us)
    if response.truncated:
        cut = read_on_last_series(response)
        rest = [k for k in keys if k > cut]
        for w in sorted({w for w, _ in rest}):
            pending = [n for ww, n in rest if ww == w]
            while pending:
                response = call(w, pending, start_us)
                if not response.truncated:
                    break
                cut = read_on_last_series(response)
                pending = [n for n in pending if n > cut[1]]
    out = {}
    for key in sorted(parts):
        times, values = parts[key]
        out[key] = MetricSeries(np.concatenate(times).astype("datetime64[us]"),
                                np.concatenate(values))
    return out


def read_events(conn, job, workers, kind=None, name=None, worker=None, start=None, end=None,
                page_size=None):
    """[FrameworkEvent] sorted by start (see Trial.framework_events).

    `workers` is called for the job's ranks when a read must be narrowed to
    one worker.
    """
    start_us, end_us = time_range(start, end)
    max_events = as_page_size(page_size)
    wire_kind = as_kind(kind)
    name = name or ""

    def call(w, k, since, until):
        request = query_pb2.ReadEventsRequest(
            job=job, kind=k, name=name, worker=w, start_unix_micros=since,
            end_unix_micros=until, max_events=max_events)
        return conn.call("ReadEvents", request, job=job)

    def too_many(w, k, at):
        return QueryError(
            "more events of kind '{}' of worker {} of job '{}' start at unix microsecond {} "
            "than one answer holds ({}, and about 3 MiB): ask with a larger page_size if the "
            "count is the limit".format(
                _KIND_NAMES.get(k, k), w, job, at,
                max_events if max_events else "the collector's limit"))

    events = []
    reads = [(-1 if worker is None else worker, wire_kind, start_us, end_us)]
    while reads:
        w, k, since, until = reads.pop()
        response = call(w, k, since, until)
        if not response.truncated:
            events.extend(response.events)
        elif w < 0:
            reads.extend((rank, k, since, until) for rank in workers())
        elif k == _Kind.KIND_UNSPECIFIED:
            reads.extend((w, each, since, until) for each in KINDS.values())
        elif name:
            # One group, in (start, end) order: read on from the last start.
            events.extend(response.events)
            while response.truncated:
                last = events[-1].event
                seen = (last.start_unix_micros, last.end_unix_micros)
                response = call(w, k, seen[0], until)
                new = [e for e in response.events
                       if (e.event.start_unix_micros, e.event.end_unix_micros) > seen]
                if response.truncated and not new:
                    raise too_many(w, k, seen[0])
                events.extend(new)
        else:
            # Several names, each in start order: split the time range.
            middle = max(response.events[-1].event.start_unix_micros, since + 1)
            if until and middle >= until:
                raise too_many(w, k, since)
            reads.append((w, k, middle, until))
            reads.append((w, k, since, middle))
    events.sort(key=lambda e: (e.event.start_unix_micros, e.worker, e.event.kind, e.event.name,
                               e.event.end_unix_micros))
    return [_event(e) for e in events]


def _event(worker_event):
    e = worker_event.event
    return FrameworkEvent(
        kind=_KIND_NAMES.get(e.kind, str(e.kind)),
        name=e.name,
        worker=worker_event.worker,
        mode=ModeKeys(e.mode) if e.mode in tuple(ModeKeys) else None,
        step=e.step,
        mode_step=e.mode_step,
        start=np.datetime64(e.start_unix_micros, "us"),
        end=np.datetime64(e.end_unix_micros, "us"),
        duration=np.timedelta64(e.end_unix_micros - e.start_unix_micros, "us"))
