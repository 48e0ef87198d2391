"""sonde.trials reads the profiler's data: a real sonde.torch.Hook with the
profiler on trains a few steps against a real collector, then a Trial reads
its system metrics and framework events, by name, kind and time range, and
reads past the collector's per-call limit when given a small page size.
"""

import datetime
import re
import time

import grpc
import numpy as np
import pytest
import torch
import torch.nn as nn

import sonde.torch as smd
from sonde import modes
from sonde.trials import FrameworkEvent, MetricSeries, QueryError, create_trial
from sonde.v1 import profile_pb2, query_pb2, query_pb2_grpc

STEPS = 8
SAMPLE_SECONDS = 0.002  # per sample: a batch of 2 waits at least 4 ms
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


class SlowDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 2 * STEPS

    def __getitem__(self, i):
        time.sleep(SAMPLE_SECONDS)
        return torch.randn(6), i % 3


class Run:
    """What the training loop knows about itself."""

    def __init__(self, begin_micros, end_micros, tick_micros):
        self.begin = begin_micros
        self.end = end_micros
        self.ticks = tick_micros  # starts of the hand-timed "tick" spans


def profiled_hook(address, job, worker=0, world_size=1):
    """A hook for rank `worker` of `world_size`, the profiler sampling every
    100 ms."""
    return smd.Hook(collector=address, job=job, strict=True, worker=worker,
                    world_size=world_size, include_workers="all",
                    profiler=smd.ProfilerConfig(system_monitor_interval_millis=100))


def train(hook):
    """STEPS real training steps (one epoch of a DataLoader of 2-sample
    batches) for at least 0.8 s, then closes the hook."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.set_mode(modes.TRAIN)
    begin = time.time()
    for x, y in torch.utils.data.DataLoader(SlowDataset(), batch_size=2):
        with hook.span("augment"):
            time.sleep(0.005)
        with hook.span("log"):
            pass
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    # Spans whose times the test chooses, 10 s before the run so they meet no
    # other event: pairs that share a start, the boundary case of paging.
    # (The public hook.span times its block; _record takes given times.)
    t0 = int(begin * 1e6) - 10_000_000
    ticks = [t0 + i * 1000 for i in range(3)]
    for start in ticks:
        hook._record(profile_pb2.TraceEvent.KIND_SPAN, "tick", start, start + 100)
        hook._record(profile_pb2.TraceEvent.KIND_SPAN, "tick", start, start + 200)
    time.sleep(max(0.0, begin + 0.8 - time.time()))  # several system samples
    hook.close()
    return Run(int(begin * 1e6), int(time.time() * 1e6), ticks)


def micros(times):
    return np.asarray(times).astype("datetime64[us]").astype(np.int64)


def spy_on_reads(trial, monkeypatch):
    """Records (method, truncated) of each ReadMetrics/ReadEvents answer."""
    answers = []
    real = trial._conn.call

    def call(method, request, **kwargs):
        response = real(method, request, **kwargs)
        if method in ("ReadMetrics", "ReadEvents"):
            answers.append((method, response.truncated))
        return response

    monkeypatch.setattr(trial._conn, "call", call)
    return answers


def test_metric_names_and_system_metrics_of_a_real_loop(collector):
    run = train(profiled_hook(collector.address, "profiled"))
    with create_trial(collector.address, "profiled") as trial:
        names = trial.metric_names()
        assert list(names) == [0]
        assert {"cpu.util_percent", "memory.used_bytes", "process.rss_bytes",
                "framework.dataloader_workers"} <= set(names[0])
        assert names[0] == sorted(names[0])
        assert trial.metric_names(worker="worker_0") == names
        assert trial.metric_names(worker=1) == {}
        cpu_names = trial.metric_names(regex=r"^cpu\.")[0]
        assert "cpu.util_percent" in cpu_names
        assert all(n.startswith("cpu.") for n in cpu_names)

        series = trial.system_metrics(names=["cpu.util_percent", "process.rss_bytes"])
        assert sorted(series) == [(0, "cpu.util_percent"), (0, "process.rss_bytes")]
        cpu = series[(0, "cpu.util_percent")]
        assert isinstance(cpu, MetricSeries)
        assert cpu.times.dtype == np.dtype("datetime64[us]")
        assert cpu.values.dtype == np.float64
        assert len(cpu.times) == len(cpu.values) >= 3  # 0.8 s at 100 ms, loosely
        t = micros(cpu.times)
        assert (np.diff(t) > 0).all()
        assert run.begin - 1_000_000 <= t[0] and t[-1] <= run.end
        assert ((cpu.values >= 0) & (cpu.values <= 100)).all()
        assert (series[(0, "process.rss_bytes")].values > 1 << 20).all()  # this process's RSS
        # The DataLoader had no worker processes.
        gauge = trial.system_metrics(names="framework.dataloader_workers")
        assert set(gauge[(0, "framework.dataloader_workers")].values) == {0.0}

        # The same numbers as the collector's raw answer, bit for bit.
        channel = grpc.insecure_channel(collector.address)
        raw = query_pb2_grpc.QueryStub(channel).ReadMetrics(
            query_pb2.ReadMetricsRequest(job="profiled", names=["cpu.util_percent"], worker=-1),
            timeout=10)
        channel.close()
        assert t.tolist() == list(raw.series[0].unix_micros)
        assert cpu.values.tobytes() == np.array(raw.series[0].values).tobytes()

        # names and regex together select either, as the collector's filter does.
        both = trial.system_metrics(names="process.rss_bytes", regex=r"^cpu\.util")
        assert set(both) == {(0, "process.rss_bytes")} | {
            (0, n) for n in cpu_names if re.search(r"^cpu\.util", n)}
        assert trial.system_metrics(names="no.such.metric") == {}


def test_framework_events_count_the_steps_trained(collector):
    run = train(profiled_hook(collector.address, "events"))
    with create_trial(collector.address, "events") as trial:
        steps = trial.framework_events(kind="step")
        assert len(steps) == STEPS
        assert [e.step for e in steps] == list(range(STEPS))
        assert [e.mode_step for e in steps] == list(range(STEPS))
        for e in steps:
            assert isinstance(e, FrameworkEvent)
            assert (e.kind, e.name, e.worker, e.mode) == ("step", "", 0, modes.TRAIN)
            assert isinstance(e.start, np.datetime64) and isinstance(e.duration, np.timedelta64)
            assert e.duration == e.end - e.start > np.timedelta64(0, "us")
            assert run.begin <= micros(e.start) <= run.end
        assert [e.start for e in steps] == sorted(e.start for e in steps)

        assert len(trial.framework_events(kind="forward")) == STEPS
        assert len(trial.framework_events(kind="backward")) == STEPS
        waits = trial.framework_events(kind="data_wait")
        assert len(waits) == STEPS  # one per batch; the StopIteration waits for none
        assert all(w.duration >= np.timedelta64(int(2 * SAMPLE_SECONDS * 1e6), "us")
                   for w in waits)
        augment = trial.framework_events(kind="span", name="augment")
        # A step starts at the model's forward, so a span before it falls in
        # the step before (-1: before the first).
        assert [e.step for e in augment] == list(range(-1, STEPS - 1))
        assert all(e.duration >= np.timedelta64(5000, "us") for e in augment)
        init = trial.framework_events(kind="INIT")  # kinds ignore case
        assert len(init) == 1 and init[0].end == steps[0].start

        everything = trial.framework_events()
        assert [e.start for e in everything] == sorted(e.start for e in everything)
        kinds = [e.kind for e in everything]
        assert {k: kinds.count(k) for k in set(kinds)} == {
            "step": STEPS, "forward": STEPS, "backward": STEPS, "data_wait": STEPS, "init": 1,
            "span": 2 * STEPS + 6}
        assert trial.framework_events(worker=1) == []


def test_time_ranges_keep_what_starts_inside(collector):
    train(profiled_hook(collector.address, "ranges"))
    with create_trial(collector.address, "ranges") as trial:
        steps = trial.framework_events(kind="step")
        lo, hi = steps[2].start, steps[5].start
        lo_us, hi_us = int(micros(lo)), int(micros(hi))
        as_datetime = [_EPOCH + datetime.timedelta(microseconds=m) for m in (lo_us, hi_us)]
        as_text = [np.datetime_as_string(t, unit="us") + "Z" for t in (lo, hi)]
        with_offset = [d.astimezone(datetime.timezone(datetime.timedelta(hours=2))).isoformat()
                       for d in as_datetime]
        for start, end in [(lo, hi), (lo_us, hi_us), as_datetime, as_text, with_offset]:
            got = trial.framework_events(kind="step", start=start, end=end)
            assert [e.step for e in got] == [2, 3, 4], (start, end)
        assert [e.step for e in trial.framework_events(kind="step", start=lo)] == list(
            range(2, STEPS))
        assert [e.step for e in trial.framework_events(kind="step", end=lo)] == [0, 1]

        key = (0, "cpu.util_percent")
        cpu = trial.system_metrics(names="cpu.util_percent")[key]
        part = trial.system_metrics(names="cpu.util_percent", start=cpu.times[1],
                                    end=cpu.times[3])[key]
        assert (part.times == cpu.times[1:3]).all()
        assert part.values.tobytes() == cpu.values[1:3].tobytes()
        later = cpu.times[-1] + np.timedelta64(1, "h")
        assert trial.system_metrics(start=later) == {}  # series without points are left out
        assert trial.framework_events(start=later) == []

        with pytest.raises(ValueError, match="naive datetime"):
            trial.framework_events(start=datetime.datetime(2024, 5, 1, 12))
        with pytest.raises(ValueError, match="has no zone"):
            trial.system_metrics(end="2024-05-01T12:00:00")
        with pytest.raises(ValueError, match="must be after start"):
            trial.framework_events(start=hi, end=lo)
        with pytest.raises(ValueError, match="unknown event kind 'sleep': use step, data_wait"):
            trial.framework_events(kind="sleep")
        with pytest.raises(ValueError, match="page_size must be >= 1"):
            trial.system_metrics(page_size=0)


def test_a_small_page_size_still_reads_everything_once(collector, monkeypatch):
    # Two ranks: answers span workers, so reading on must go worker by
    # worker. Rank 1 joins first (the job ends when every joined rank has),
    # then each trains in turn; rank 1's hook also sees rank 0's data waits.
    second = profiled_hook(collector.address, "paged", worker=1, world_size=2)
    assert second.wait_until_connected()
    run = train(profiled_hook(collector.address, "paged", worker=0, world_size=2))
    train(second)
    with create_trial(collector.address, "paged") as trial:
        answers = spy_on_reads(trial, monkeypatch)
        all_events = trial.framework_events()
        all_metrics = trial.system_metrics()
        assert answers and not any(truncated for _, truncated in answers)
        names = trial.metric_names()
        assert sorted(all_metrics) == sorted((w, n) for w in (0, 1) for n in names[w])
        assert [e.worker for e in all_events if e.kind == "step"].count(1) == STEPS

        for page in (3, 5):
            del answers[:]
            assert trial.framework_events(page_size=page) == all_events
            assert ("ReadEvents", True) in answers  # it did have to read on
            del answers[:]
            metrics = trial.system_metrics(page_size=page)
            assert ("ReadMetrics", True) in answers
            assert list(metrics) == list(all_metrics)
            for key, series in all_metrics.items():
                assert (metrics[key].times == series.times).all(), key
                assert metrics[key].values.tobytes() == series.values.tobytes(), key
            # One (worker, kind, name) group, read on from the last start:
            # spans that share a start are each kept once.
            ticks = trial.framework_events(kind="span", name="tick", worker=0, page_size=page)
            assert [(int(micros(e.start)), int(e.duration / np.timedelta64(1, "us")))
                    for e in ticks] == [(t, d) for t in run.ticks for d in (100, 200)]

        # One point a call: every point, each once.
        one = trial.system_metrics(names=["cpu.util_percent", "memory.used_bytes"], page_size=1)
        assert sorted(one) == [(w, n) for w in (0, 1)
                               for n in ("cpu.util_percent", "memory.used_bytes")]
        for key in one:
            assert (one[key].times == all_metrics[key].times).all()
        assert trial.framework_events(kind="step", page_size=1) == [
            e for e in all_events if e.kind == "step"]
        # Two events share a start: a page of one cannot get past them.
        with pytest.raises(QueryError, match="larger page_size"):
            trial.framework_events(kind="span", name="tick", page_size=1)


def test_a_series_with_no_point_in_the_range_does_not_end_paging(collector):
    # A gauge set halfway: before then its series exists but has no point,
    # and the collector still sends it (empty). When a page ends exactly at
    # the end of the series before it, the answer ends on that empty series.
    hook = profiled_hook(collector.address, "gap")
    model = nn.Linear(4, 2)
    hook.register_module(model)
    deadline = time.time() + 0.7
    while time.time() < deadline:
        model(torch.ones(1, 4))
        time.sleep(0.01)
    halfway = int(time.time() * 1e6)
    hook._native_call("set_profiler_gauge", "framework.late", 1.0)
    deadline = time.time() + 0.5
    while time.time() < deadline:
        model(torch.ones(1, 4))
        time.sleep(0.01)
    hook.close()
    with create_trial(collector.address, "gap") as trial:
        assert "framework.late" in trial.metric_names()[0]
        early = trial.system_metrics(end=halfway)
        assert (0, "framework.late") not in early and (0, "cpu.util_percent") in early
        assert len(trial.system_metrics(start=halfway)[(0, "framework.late")].times) >= 1
        # The series just before it by name; pages of about its length.
        before = max(n for _, n in early if n < "framework.late")
        n = len(early[(0, before)].times)
        assert n >= 3
        for page in (n - 1, n, n + 1):
            paged = trial.system_metrics(end=halfway, page_size=page)
            assert list(paged) == list(early), page
            for key, series in early.items():
                assert (paged[key].times == series.times).all(), (page, key)
