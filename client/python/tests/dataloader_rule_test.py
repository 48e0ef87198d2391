"""The Dataloader profiler rule on a real PyTorch loop.

A real torch DataLoader over a deliberately slow Dataset feeds a small CNN
trained with a profiling sonde.torch hook (system samples every 100 ms). The
hook times each batch fetch (a data wait) and sends the loader's worker
processes as the gauge framework.dataloader_workers; the collector's
Dataloader rule compares its median with the cores the samples report
(cpu.<i>.util_percent). The rule runs with SageMaker's defaults:
min_threshold=70 and max_threshold=200 percent of the cores, patience=10
counts (about a second at 100 ms), so nothing needs shrinking.

  num_workers=0: the training process loads every batch itself, fewer than
      70% of the cores on any machine with a core: fires, and every step
      waits for its batch.
  num_workers=ceil(0.7 x os.cpu_count()): the fewest that satisfy the rule
      (at most 2x the cores whatever the machine): quiet.
"""

import math
import os
import re
import time

import grpc
import torch
import torch.nn as nn
import torch.nn.functional as F

import sonde.torch as smd
from sonde import modes
from sonde.v1 import profile_pb2, query_pb2, query_pb2_grpc, rule_pb2

SAMPLE_SECONDS = 0.005  # per sample: a slow decode/augment step
BATCH = 4               # so every batch loaded in-process takes >= 20 ms


class SlowDataset(torch.utils.data.Dataset):
    """8x8 one-channel images that take SAMPLE_SECONDS each to "decode"."""

    def __len__(self):
        return 100000  # longer than any run: one epoch

    def __getitem__(self, i):
        time.sleep(SAMPLE_SECONDS)
        g = torch.Generator().manual_seed(i)
        return torch.randn(1, 8, 8, generator=g), i % 10


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(x.flatten(1))


class Reader:
    def __init__(self, address, job):
        self.stub = query_pb2_grpc.QueryStub(grpc.insecure_channel(address))
        self.job = job

    def result(self, rule):
        results = self.stub.GetRuleResults(query_pb2.GetRuleResultsRequest(job=self.job),
                                           timeout=10).results
        return next((r for r in results if r.rule == rule), None)

    def fired(self, rule):
        r = self.result(rule)
        return r is not None and r.status == rule_pb2.RULE_STATUS_ISSUES_FOUND

    def verdict(self, rule, timeout=60):
        """The rule's final result once the ended job's rules have judged:
        from WatchRuleResults, which sends the current results and then
        each change as it is stored."""
        last = None
        for r in self.stub.WatchRuleResults(query_pb2.GetRuleResultsRequest(job=self.job),
                                             timeout=timeout):
            if r.rule != rule:
                continue
            last = r
            if r.status != rule_pb2.RULE_STATUS_IN_PROGRESS:
                return r
        raise AssertionError("no verdict from %s: %r" % (rule, last))

    def metric(self, name):
        resp = self.stub.ReadMetrics(query_pb2.ReadMetricsRequest(
            job=self.job, names=[name], worker=0), timeout=10)
        return [v for s in resp.series if s.name == name for v in s.values]

    def cores(self):
        """The cores the samples report, as the rule counts them."""
        names = self.stub.ListMetrics(query_pb2.ListMetricsRequest(job=self.job),
                                      timeout=10).workers[0].names
        return sum(bool(re.fullmatch(r"cpu\.\d+\.util_percent", n)) for n in names)

    def data_waits(self):
        resp = self.stub.ReadEvents(query_pb2.ReadEventsRequest(
            job=self.job, kind=profile_pb2.TraceEvent.KIND_DATA_WAIT, worker=0), timeout=10)
        return [e.event for e in resp.events]


def train(collector, job, num_workers, until, deadline_seconds=30):
    """Trains until `until()` (asked every 100 ms) or the deadline; closes
    the hook (which ends the job). Returns (whether until() ended it, steps)."""
    loader = torch.utils.data.DataLoader(SlowDataset(), batch_size=BATCH,
                                         num_workers=num_workers)
    model = Net()
    hook = smd.Hook(collector=collector.address, job=job, strict=True, rules="Dataloader",
                    profiler=smd.ProfilerConfig(system_monitor_interval_millis=100))
    hook.register_module(model)
    loss_fn = nn.CrossEntropyLoss()
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hook.set_mode(modes.TRAIN)
    start = time.time()
    next_check = start
    done = False
    steps = 0
    try:
        for x, y in loader:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            steps += 1
            now = time.time()
            if now >= next_check:
                if until():
                    done = True
                    break
                next_check = now + 0.1
            if now - start > deadline_seconds:
                break
    finally:
        hook.close()
    return done, steps


def test_dataloader_fires_when_the_training_process_loads_every_batch(collector):
    r = Reader(collector.address, "in-process-loading")
    fired, steps = train(collector, "in-process-loading", 0, lambda: r.fired("Dataloader"))
    assert fired, "no Dataloader verdict after %d steps" % steps
    result = r.verdict("Dataloader")
    cores = r.cores()
    assert cores >= 1
    assert result.status == rule_pb2.RULE_STATUS_ISSUES_FOUND, result.message
    assert result.observed == 0  # the median worker count
    assert math.isclose(result.threshold, cores * 70 / 100)
    assert result.message.startswith(
        "worker 0: a median of 0 data-loader processes for %d CPU cores, fewer than "
        "min_threshold=70%% of the cores" % cores), result.message
    assert set(r.metric("framework.dataloader_workers")) == {0.0}
    # The loop waited for every batch while the training process loaded it:
    # BATCH samples of SAMPLE_SECONDS each, at least.
    waits = r.data_waits()
    assert len(waits) >= steps - 1, (len(waits), steps)
    least = int(BATCH * SAMPLE_SECONDS * 1e6)
    assert all(w.end_unix_micros - w.start_unix_micros >= least for w in waits), \
        sorted(w.end_unix_micros - w.start_unix_micros for w in waits)[:5]


def test_dataloader_is_quiet_with_enough_worker_processes(collector):
    # The fewest workers the rule accepts: 70% of the cores, rounded up
    # (integer arithmetic: 0.7 * 10 is 7.000000000000001 in floating point).
    # At most 2x the cores, so never too many either.
    workers = -(-os.cpu_count() * 70 // 100)
    r = Reader(collector.address, "worker-loading")
    # Three times the rule's patience of 10 counts before the job ends.
    done, steps = train(collector, "worker-loading", workers,
                        lambda: len(r.metric("framework.dataloader_workers")) >= 30)
    assert done, "fewer than 30 counts stored after %d steps" % steps
    result = r.verdict("Dataloader")
    cores = r.cores()
    assert cores * 70 / 100 <= workers <= cores * 2, (cores, workers)
    assert result.status == rule_pb2.RULE_STATUS_NO_ISSUES_FOUND, result.message
    assert result.datapoints >= 30
    assert set(r.metric("framework.dataloader_workers")) == {float(workers)}
    assert r.data_waits(), "no DataLoader wait recorded"
