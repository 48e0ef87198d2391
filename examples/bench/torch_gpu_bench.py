#!/usr/bin/python3
"""What sonde.torch costs a PyTorch training loop on a GPU, and whether it
stored what it was asked to.

  python3 examples/bench/torch_gpu_bench.py --collector_binary PATH [--device cuda]

The model is the MLP the first GPU run measured (issue 14): 12 x
Linear(2048, 2048) + ReLU, 50.4M parameters in 26 tensors, batch 512, SGD,
`loss.item()` every step (the sync a real loop makes). Copies of the model
train side by side in one process, taking turns in rounds of --steps
steps, in an order shuffled anew each round, after a warm-up round:
one without a hook (the baseline) and one per mode with its own hook and
job: `stats` (statistics of every weight and gradient every step, no
values), `stats_deferred` (the same with defer_device_reads: the statistics
overlap training rather than the stream waiting after each save; torch
2.0+), `values100` and `values10` (raw values every 100 and 10 steps).

Printed: median and mean step time of each copy and their ratios to the
baseline; the hook's counters (statistics batches a step, waits for the
device, tensors and values dropped, device values that went through the
local spill file); and what the collector stored: every
saved step of the steps run present and complete, the hook's drop
counters equal to the collector's (StepInfo), and, for the copies saving
values, the weights and gradients stored at one more saving step equal,
bit for bit, the model's (cloned on the device around that step). Exit
status 1 if a check fails.

On a machine without a GPU, --device cpu with a smaller --width runs the
same loop on the CPU path (tests/ run it that way; its times mean little).
"""

import argparse
import random
import statistics
import sys
import time

import grpc
import torch
import torch.nn as nn

import sonde.torch as smd
from sonde.testing import Collector, find_collector_binary
from sonde.trials import create_trial
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
        self.steps_run = 0
        self.verify_step = None
        self.verify_tensors = {}  # stored name -> what the model held
        self.verified = 0
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
        self.steps_run += 1
        if timed:
            self.times.append(time.perf_counter() - start)

    def verification_step(self, x, y):
        """One more saving step, untimed, with the weights the hook saves at
        its start and the gradients it saves at the end of backward cloned
        (SGD without momentum leaves the gradients as backward wrote them)."""
        while self.steps_run % self.interval != 0:
            self.step(x, y, timed=False)
        self.verify_step = self.steps_run
        top = self.model._get_name()
        params = list(self.model.named_parameters())
        weights = {"%s_%s" % (top, n): p.detach().clone() for n, p in params}
        self.step(x, y, timed=False)
        grads = {"gradient/%s_%s" % (top, n): p.grad.detach().clone() for n, p in params}
        self.verify_tensors = {k: v.cpu().numpy() for k, v in {**weights, **grads}.items()}


def check(copy, stub, address, failures):
    """What the collector stored for a hooked copy."""
    job = copy.hook._options["job"]
    counters = copy.hook.counters()
    steps = stub.ListSteps(query_pb2.ListStepsRequest(job=job), timeout=60).steps
    by_step = {s.step: s for s in steps}
    expected = [s for s in range(copy.steps_run) if s % copy.interval == 0]
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
    if copy.verify_tensors:
        differ = []
        with create_trial(address, job) as trial:
            for name, want in sorted(copy.verify_tensors.items()):
                try:
                    got = trial.tensor(name).value(copy.verify_step)
                except Exception as e:  # noqa: BLE001 -- reported as a failed check
                    differ.append("%s (%s)" % (name, e))
                    continue
                if got.shape != want.shape or got.tobytes() != want.tobytes():
                    differ.append(name)
        if differ:
            failures.append("%s: at step %d, %d of %d stored tensors differ from the model's: %s" % (
                copy.name, copy.verify_step, len(differ), len(copy.verify_tensors),
                ", ".join(differ[:5])))
        copy.verified = len(copy.verify_tensors) - len(differ)
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
        # A new order every round (fixed seed), so that no copy always runs
        # right after the one whose downloads and ingest it would absorb.
        order, rng = list(range(len(copies))), random.Random(20261127)
        # Where the hooks' time goes over the timed rounds (their counters
        # when the rounds begin and end).
        timed_from, timed_to = {}, {}
        for r in range(args.rounds + 1):
            if r == 1:
                timed_from = {c.name: c.hook.counters() for c in copies if c.hook is not None}
            rng.shuffle(order)
            for k in order:
                for _ in range(args.steps):
                    copies[k].step(x, y, timed=r > 0)
        timed_to = {c.name: c.hook.counters() for c in copies if c.hook is not None}
        for c in copies:
            if c.hook is not None and MODES[c.name][1]:
                c.verification_step(x, y)
        channel = grpc.insecure_channel(collector.address)
        stub = query_pb2_grpc.QueryStub(channel)
        base = copies[0]
        base_median = statistics.median(base.times)
        base_mean = statistics.mean(base.times)
        print("\nhost time a timed step, means in ms (hook: the training thread in Sonde's "
              "hooks, native calls included; enqueue: the device capture's enqueues within "
              "them, of which engine: its CUDA calls, and to sender: handing tensors over)")
        print("%-14s %9s %9s %9s %9s" % ("copy", "hook", "enqueue", "engine", "to sender"))
        for c in copies:
            if c.hook is None or not c.times:
                continue
            a, b = timed_from[c.name], timed_to[c.name]
            print("%-14s" % c.name + "".join(
                " %9.3f" % ((b.get(k, 0) - a.get(k, 0)) * 1e3 / len(c.times))
                for k in ("hook_seconds", "device_enqueue_seconds", "device_engine_seconds",
                          "device_handover_seconds")))
        print("\n%-14s %10s %10s %9s %9s %8s %7s %10s %9s %12s %9s %9s" % (
            "copy", "median ms", "mean ms", "x median", "x mean", "batches", "waits",
            "dropped t/v", "spilled v", "saved steps", "complete", "verified"))
        for c in copies:
            med, mean = statistics.median(c.times), statistics.mean(c.times)
            row = "%-14s %10.3f %10.3f %9.4f %9.4f" % (
                c.name, med * 1e3, mean * 1e3, med / base_median, mean / base_mean)
            if c.hook is not None:
                c.hook.close()
                counters, expected, complete = check(c, stub, collector.address, failures)
                steps = max(1, counters.get("steps", 1))
                row += " %8.2f %7d %10s %9d %12d %9d %9s" % (
                    counters.get("device_batches", 0) / steps, counters.get("device_waits", 0),
                    "%d/%d" % (counters.get("tensors_dropped", 0),
                               counters.get("values_dropped", 0)),
                    counters.get("device_values_spilled", 0), expected, complete,
                    "%d/%d" % (c.verified, len(c.verify_tensors)) if c.verify_tensors else "-")
            print(row)
        channel.close()
    for f in failures:
        print("FAILED " + f)
    print("checks passed" if not failures else "checks FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
