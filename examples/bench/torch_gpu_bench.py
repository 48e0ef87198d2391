#!/usr/bin/python3
"""What sonde.torch costs a PyTorch training loop on a GPU, and whether it
stored what it was asked to.

  python3 examples/bench/torch_gpu_bench.py --collector_binary PATH [--device cuda]

The model is the MLP the first GPU run measured (issue 14): 12 x
Linear(2048, 2048) + ReLU, 50.4M parameters in 26 tensors, batch 512, SGD,
`loss.item()` every step (the sync a real loop makes). Copies of the model
train side by side in one process, taking turns in rounds of --steps
steps, starting with a different copy each round, after a warm-up round:
one without a hook (the baseline) and one per mode with its own hook and
job: `stats` (statistics of every weight and gradient every step, no
values), `stats_deferred` (the same with defer_device_reads: the statistics
overlap training rather than the stream waiting after each save; torch
2.0+), `values100` and `values10` (raw values every 100 and 10 steps).

Printed: median and mean step time of each copy and their ratios to the
baseline; the hook's counters (statistics batches a step, waits for the
device, tensors and values dropped); and what the collector stored: every
saved step present and complete, and the hook's drop counters equal to
the collector's (StepInfo). Exit status 1 if a check fails.

On a machine without a GPU, --device cpu with a smaller --width runs the
same loop on the CPU path (tests/ run it that way; its times mean little).
"""

import argparse
import statistics
import sys
import time

import grpc
import torch
import torch.nn as nn

import sonde.torch as smd
from sonde.testing import Collector, find_collector_binary
from sonde.v1 import query_pb2, query_pb2_grpc

# name: (save interval, values, defer_device_reads)
MODES = {"stats": (1, False, False), "stats_deferred": (1, False, True),
         "values100": (100, True, False), "values10": (10, True, False)}


def mlp(width, layers):
    parts = []
    for _ in range(layers):
        parts += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*parts)


class Copy:
    """One copy of the model, its optimizer and (except the baseline) hook."""

    def __init__(self, name, args, address, device):
        torch.manual_seed(0)
        self.name = name
        self.model = mlp(args.width, args.layers).to(device)
        self.loss_fn = nn.CrossEntropyLoss()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.times = []
        self.hook = None
        if name != "none":
            interval, values, deferred = MODES[name]
            self.interval = interval
            self.hook = smd.Hook(
                collector=address, job="torch-gpu-" + name, strict=False,
                save_config=smd.SaveConfig(save_interval=interval),
                reduction_config=None if values else smd.ReductionConfig(
                    reductions=["min", "max", "mean", "std"], norms=["l2"]),
                include_collections=["weights", "biases", "gradients"],
                close_timeout_seconds=600, defer_device_reads=deferred)
            self.hook.register_module(self.model)
            self.hook.register_loss(self.loss_fn)

    def step(self, x, y, timed):
        start = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        self.opt.step()
        loss.item()
        if timed:
            self.times.append(time.perf_counter() - start)


def check(copy, stub, failures):
    """What the collector stored for a hooked copy."""
    job = copy.hook._options["job"]
    counters = copy.hook.counters()
    steps = stub.ListSteps(query_pb2.ListStepsRequest(job=job), timeout=60).steps
    by_step = {s.step: s for s in steps}
    last = max(by_step) if by_step else -1
    expected = [s for s in range(last + 1) if s % copy.interval == 0]
    missing = [s for s in expected if s not in by_step]
    complete = sum(1 for s in expected if s in by_step and by_step[s].complete)
    dropped_t = sum(s.tensors_dropped for s in steps)
    dropped_v = sum(s.values_dropped for s in steps)
    if missing:
        failures.append("%s: saved steps missing: %s" % (copy.name, missing[:10]))
    if complete != len(expected):
        failures.append("%s: %d of %d saved steps incomplete" % (
            copy.name, len(expected) - complete, len(expected)))
    if (dropped_t, dropped_v) != (counters.get("tensors_dropped", 0),
                                  counters.get("values_dropped", 0)):
        failures.append("%s: the hook counted %s/%s dropped, the collector shows %d/%d" % (
            copy.name, counters.get("tensors_dropped"), counters.get("values_dropped"),
            dropped_t, dropped_v))
    return counters, len(expected), complete


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=20, help="steps of one copy in a round")
    p.add_argument("--modes", default="stats,stats_deferred,values100,values10")
    p.add_argument("--collector_binary", default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    modes = ["none"] + [m for m in args.modes.split(",") if m]
    for m in modes[1:]:
        if m not in MODES:
            p.error("unknown mode %r (stats, values100, values10)" % m)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print("device: %s, torch %s" % (name, torch.__version__))
    failures = []
    with Collector(binary=args.collector_binary or find_collector_binary()) as collector:
        copies = [Copy(m, args, collector.address, device) for m in modes]
        params = sum(t.numel() for t in copies[0].model.parameters())
        print("model: %d x Linear(%d, %d) + ReLU, %.1fM parameters in %d tensors, batch %d" % (
            args.layers, args.width, args.width, params / 1e6,
            len(list(copies[0].model.parameters())), args.batch))
        g = torch.Generator(device="cpu").manual_seed(1)
        x = torch.randn(args.batch, args.width, generator=g).to(device)
        y = torch.randint(0, args.width, (args.batch,), generator=g).to(device)
        for r in range(args.rounds + 1):
            for k in range(len(copies)):
                c = copies[(k + r) % len(copies)]
                for _ in range(args.steps):
                    c.step(x, y, timed=r > 0)
        channel = grpc.insecure_channel(collector.address)
        stub = query_pb2_grpc.QueryStub(channel)
        base = copies[0]
        base_median = statistics.median(base.times)
        base_mean = statistics.mean(base.times)
        print("\n%-10s %10s %10s %9s %9s %8s %7s %10s %12s %14s" % (
            "copy", "median ms", "mean ms", "x median", "x mean", "batches", "waits",
            "dropped t/v", "saved steps", "complete"))
        for c in copies:
            med, mean = statistics.median(c.times), statistics.mean(c.times)
            row = "%-10s %10.3f %10.3f %9.4f %9.4f" % (
                c.name, med * 1e3, mean * 1e3, med / base_median, mean / base_mean)
            if c.hook is not None:
                c.hook.close()
                counters, expected, complete = check(c, stub, failures)
                steps = max(1, counters.get("steps", 1))
                row += " %8.2f %7d %10s %12d %14d" % (
                    counters.get("device_batches", 0) / steps, counters.get("device_waits", 0),
                    "%d/%d" % (counters.get("tensors_dropped", 0),
                               counters.get("values_dropped", 0)),
                    expected, complete)
            print(row)
        channel.close()
    for f in failures:
        print("FAILED " + f)
    print("checks passed" if not failures else "checks FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
