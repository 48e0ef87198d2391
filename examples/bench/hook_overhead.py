#!/usr/bin/python3
"""Step time of PyTorch training with and without sonde.torch's hook.

  bazel run -c opt //examples/bench:hook_overhead -- [--windows 8] [--models digits,mlp]

or, by hand, with the optimised extension and collector:

  bazel build -c opt //client/python:sonde //server:sonde-collector
  PYTHONPATH=client/python:bazel-out/k8-opt/bin/client/python:examples \\
      /usr/bin/python3 examples/bench/hook_overhead.py \\
      --collector_binary bazel-out/k8-opt/bin/server/sonde-collector

What trains: two models on scikit-learn's digits, SGD, batch 32, on one
thread (torch.set_num_threads(1); the machine's second core is left to the
hook's threads and the collector): the example's DigitsCNN (0.2M
parameters) and an MLP 64-1024-1024-1024-10 (2.2M parameters; Debian's
PyTorch uses a generic BLAS, about 2 GFLOP/s on one thread here, so larger
models take seconds a step).

What is compared: for each model and each save_interval (1, 10, 100), two
copies of the model train side by side in one process, one without a hook
(the baseline) and one with a hook that saves the collections weights,
biases, gradients and losses as raw float32 values (no reductions, no
rules: 1.6 MB a saved step for the CNN, 17 MB for the MLP) to a real
sonde-collector on this machine (started on a temporary directory for the
pair; its first stdout line is its address).

How: the two copies take turns step by step (baseline, hooked, hooked,
baseline, ...), each step timed on its own, so both see the same machine
at the same moments and the noise of a shared machine cancels. Steps are
summed in windows of 100 (a window at save_interval 100 holds exactly one
saved step; at save_interval 1 the MLP's windows are 20 steps, to bound
what is stored); a first window is a warm-up. Reported, as medians over the
windows: the hooked copy's wall time per step over the baseline's, the same
for the training thread's CPU time, and the CPU the hook's own threads and
the collector spent per step (work on the other core, which a training
step does not wait for); and how long close() then took to drain what was
not yet stored.

--save_intervals 0 pairs two copies without a hook (the method's own bias);
1000000 gives a hook that saves only step 0 (the cost of a step that saves
nothing). --profile MODEL:SAVE_INTERVAL runs one hooked copy under cProfile
instead.
"""

import argparse
import collections
import cProfile
import io
import os
import pstats
import statistics
import sys
import tempfile
import time

import torch
import torch.nn as nn

import pytorch_digits
import sonde.torch as smd
from sonde.testing import Collector, find_collector_binary

SAVE_INTERVALS = (1, 10, 100)
COLLECTIONS = ["weights", "biases", "gradients", "losses"]
WINDOW = 100

# Per step, in one window: the hooked copy's wall and training-thread CPU
# seconds over the baseline's; CPU seconds of the hook's threads and of the
# collector.
Window = collections.namedtuple("Window", "wall cpu hook collector base_wall")


class WideMLP(nn.Module):
    """The larger model: 64-1024-1024-1024-10, ReLU, 2.2M parameters."""

    def __init__(self, width=1024):
        super().__init__()
        self.fc1 = nn.Linear(64, width)
        self.fc1_relu = nn.ReLU()
        self.fc2 = nn.Linear(width, width)
        self.fc2_relu = nn.ReLU()
        self.fc3 = nn.Linear(width, width)
        self.fc3_relu = nn.ReLU()
        self.out = nn.Linear(width, 10)

    def forward(self, x):
        x = self.fc1_relu(self.fc1(x.flatten(1)))
        x = self.fc2_relu(self.fc2(x))
        x = self.fc3_relu(self.fc3(x))
        return self.out(x)


# name: (model class, steps per window at save_interval 1)
MODELS = {"digits": (pytorch_digits.DigitsCNN, WINDOW), "mlp": (WideMLP, 20)}


def batches(seed, batch_size=32):
    """Endless shuffled training batches of the digits."""
    (x, y), _ = pytorch_digits.load_data(seed)
    g = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(y), generator=g)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            i = order[start:start + batch_size]
            yield x[i], y[i]


def cpu_seconds(pid):
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# Where hooks spool (--spool): a temporary directory, or False for none.
SPOOL_DIR = None

class Trainer:
    """One copy of a model with its optimizer, data and (maybe) hook."""

    def __init__(self, model_name, save_interval=None, collector=None, job=None, spool_dir=None):
        torch.manual_seed(0)
        self.model = MODELS[model_name][0]()
        self.loss_fn = nn.CrossEntropyLoss()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.data = batches(0)
        self.hook = None
        if save_interval is not None:
            self.hook = smd.Hook(collector=collector, job=job, include_collections=COLLECTIONS,
                                 save_config=smd.SaveConfig(save_interval=save_interval),
                                 spool_dir=SPOOL_DIR if spool_dir is None else spool_dir)
            self.hook.register_module(self.model)
            self.hook.register_loss(self.loss_fn)
            if not self.hook.wait_until_connected(30):
                raise RuntimeError("collector %s did not accept %s" % (collector, job))

    def step(self):
        """One training step; (wall, this thread's CPU) seconds."""
        wall, cpu = time.perf_counter(), time.thread_time()
        x, y = next(self.data)
        self.optimizer.zero_grad()
        self.loss_fn(self.model(x), y).backward()
        self.optimizer.step()
        return time.perf_counter() - wall, time.thread_time() - cpu


def measure_pair(model_name, save_interval, windows, collector_binary):
    """([Window, one per timed window], seconds close() took)."""
    steps = MODELS[model_name][1] if save_interval == 1 else WINDOW
    with Collector(binary=collector_binary) as collector:
        base = Trainer(model_name)
        hooked = Trainer(model_name, save_interval or None, collector.address,
                         "bench-%s-%d" % (model_name, save_interval))
        out = []
        for w in range(windows + 1):  # window 0 warms up
            sums = {id(base): [0.0, 0.0], id(hooked): [0.0, 0.0]}
            process, coll = time.process_time(), cpu_seconds(collector.proc.pid)
            for i in range(steps):
                for t in ((base, hooked) if i % 2 == 0 else (hooked, base)):
                    wall, cpu = t.step()
                    sums[id(t)][0] += wall
                    sums[id(t)][1] += cpu
            (bw, bc), (hw, hc) = sums[id(base)], sums[id(hooked)]
            if w:
                out.append(Window(hw / bw, hc / bc,
                                  (time.process_time() - process - bc - hc) / steps,
                                  (cpu_seconds(collector.proc.pid) - coll) / steps, bw / steps))
        started = time.perf_counter()
        if hooked.hook is not None:
            hooked.hook.close()
        return out, time.perf_counter() - started


def quartiles(values):
    q = statistics.quantiles(values, n=4) if len(values) > 1 else list(values) * 3
    return "x%.3f (%.3f-%.3f)" % (statistics.median(values), q[0], q[2])


def report(results, out=sys.stdout):
    print("\nMedians over windows. wall, CPU: the hooked copy's time per step over the "
          "baseline's in the same\nwindow (25th-75th percentile). hook threads, collector: "
          "their CPU per step. close: draining at the end.", file=out)
    print("%-7s %-13s %9s  %-22s %-22s %12s %10s %7s" % (
        "model", "save", "base ms", "wall", "training-thread CPU", "hook threads",
        "collector", "close"), file=out)
    for (model_name, si), (windows, close) in results.items():
        print("%-7s %-13s %9.2f  %-22s %-22s %9.3f ms %7.3f ms %5.2f s" % (
            model_name, "every %d" % si, statistics.median(w.base_wall for w in windows) * 1e3,
            quartiles([w.wall for w in windows]), quartiles([w.cpu for w in windows]),
            statistics.median(w.hook for w in windows) * 1e3,
            statistics.median(w.collector for w in windows) * 1e3, close), file=out)


def profile(model_name, save_interval, collector_binary, windows, top=25):
    """Runs one hooked copy under cProfile and prints the costliest calls."""
    with Collector(binary=collector_binary) as collector:
        trainer = Trainer(model_name, save_interval, collector.address,
                          "bench-profile-%s-%d" % (model_name, save_interval))
        for _ in range(WINDOW):
            trainer.step()
        profiler = cProfile.Profile()
        profiler.enable()
        walls = [trainer.step()[0] for _ in range(windows * WINDOW)]
        profiler.disable()
        trainer.hook.close()
    print("%s at save_interval %d: %.3f ms/step under cProfile" % (
        model_name, save_interval, statistics.mean(walls) * 1e3))
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    print(text.getvalue())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="digits,mlp", help="comma-separated: digits, mlp")
    p.add_argument("--windows", type=int, default=8, help="timed windows per pair")
    p.add_argument("--save_intervals", default=",".join(map(str, SAVE_INTERVALS)),
                   help="comma-separated (default: %(default)s); 0 and 1000000: see above")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--collector_binary", default=None,
                   help="default: $SONDE_COLLECTOR_BINARY, the runfiles' or bazel-bin's")
    p.add_argument("--spool", default="on", choices=("on", "off"),
                   help="the hook's durable spool (default on, as for users; in a "
                        "temporary directory)")
    p.add_argument("--profile", metavar="MODEL:SAVE_INTERVAL",
                   help="profile one hooked copy (e.g. digits:10) for --windows windows")
    args = p.parse_args(argv)
    global SPOOL_DIR
    SPOOL_DIR = tempfile.mkdtemp(prefix="sonde-bench-spool-") if args.spool == "on" else False
    models = args.models.split(",")
    for m in models:
        if m not in MODELS:
            p.error("unknown model %r" % m)
    collector_binary = args.collector_binary or find_collector_binary()
    torch.set_num_threads(args.threads)
    print("torch %s on %d thread(s); sonde extension %s; collector %s" % (
        torch.__version__, torch.get_num_threads(), sys.modules["sonde._sonde"].__file__,
        collector_binary))
    if args.profile:
        model_name, si = args.profile.split(":")
        profile(model_name, int(si), collector_binary, args.windows)
        return 0
    results = {}
    for m in models:
        for si in map(int, args.save_intervals.split(",")):
            results[(m, si)] = measure_pair(m, si, args.windows, collector_binary)
            windows, close = results[(m, si)]
            print("%s every %d: wall %s, CPU %s" % (m, si, quartiles([w.wall for w in windows]),
                                                   quartiles([w.cpu for w in windows])))
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
