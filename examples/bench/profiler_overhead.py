#!/usr/bin/python3
"""Step time of a CPU training loop with and without Sonde's profiler.

  bazel run -c opt //examples/bench:profiler_overhead [-- --steps 3000] [--no-framework]

Four copies of the digits example's CNN train on one thread
(torch.set_num_threads(1)) in one process, taking turns step by step so all
see the same moments of a shared machine, in an order reversed every other
step (as hook_overhead.py does: every copy's mean place in the order is the
same within each window). One copy has no hook; the others have a hook
whose profiler samples every 500 ms, every 100 ms, and every 100 ms with
the framework timings off ("100ms-sys", system metrics alone, which splits
the cost into its two parts); --no-framework turns the framework timings
off in the 500ms and 100ms copies too. The hooks save no tensors
(save_interval 10^9), so what is measured is the profiler alone: the
system sampler's thread and the framework timings (step, forward and
backward events on every step). Step times are summed in windows of 50;
reported are the medians over windows (the first is a warm-up) and each
profiled copy's median ratio to the unprofiled one, with its quartiles.
The collector (no rules) runs on the same machine. The sampler's own CPU
cost is measured by //client/profiler:sampler_bench.
"""

import argparse
import statistics
import sys
import time

import torch
import torch.nn as nn

import pytorch_digits
import sonde.torch as smd
from sonde.testing import Collector, find_collector_binary

WINDOW = 50


def make(address, interval_millis, framework=True):
    torch.manual_seed(0)
    model = pytorch_digits.DigitsCNN()
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = None
    if interval_millis:
        hook = smd.Hook(collector=address, job="profiler-%d-%d" % (interval_millis, time.time_ns()),
                        save_config=smd.SaveConfig(save_interval=10 ** 9),
                        profiler=smd.ProfilerConfig(system_monitor_interval_millis=interval_millis,
                                                    framework=framework))
        hook.register_module(model)
        hook.register_loss(loss_fn)
    return model, loss_fn, opt, hook


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--collector_binary", default=None)
    p.add_argument("--framework", action=argparse.BooleanOptionalAction, default=True,
                   help="framework timings in the 500ms and 100ms copies (default: on)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    binary = args.collector_binary or find_collector_binary()
    with Collector(binary=binary) as collector:
        copies = {name: make(collector.address, ms, framework)
                  for name, ms, framework in (("none", 0, False), ("500ms", 500, args.framework),
                                              ("100ms", 100, args.framework),
                                              ("100ms-sys", 100, False))}
        names = list(copies)
        x = torch.randn(32, 1, 8, 8)
        y = torch.randint(0, 10, (32,))
        windows = {k: [] for k in copies}
        acc = {k: 0.0 for k in copies}
        for i in range(args.steps):
            for name in (names if i % 2 == 0 else names[::-1]):
                model, loss_fn, opt, _ = copies[name]
                start = time.perf_counter()
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
                acc[name] += time.perf_counter() - start
            if (i + 1) % WINDOW == 0:
                for name in copies:
                    windows[name].append(acc[name] / WINDOW)
                    acc[name] = 0.0
        for _, (_, _, _, hook) in copies.items():
            if hook is not None:
                hook.close()
    base = windows["none"][1:]
    if len(base) < 4:
        sys.exit("too few windows: give --steps of at least %d" % (5 * WINDOW))
    print("%-9s %12s %14s %10s %10s" % ("copy", "median step", "ratio to none", "p25", "p75"))
    for name, w in windows.items():
        ratios = [a / b for a, b in zip(w[1:], base)]
        q = statistics.quantiles(ratios, n=4)
        print("%-9s %9.0f us %14.4f %10.4f %10.4f" % (
            name, statistics.median(w[1:]) * 1e6, statistics.median(ratios), q[0], q[2]))


if __name__ == "__main__":
    main(sys.argv[1:])
