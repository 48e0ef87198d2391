#!/usr/bin/python3
"""Step time of PyTorch training with and without sonde.torch's hook.

  bazel run -c opt //examples/bench:hook_overhead -- [--blocks 7] [--models digits,mlp]

or, by hand, with the optimised extension and collector:

  bazel build -c opt //client/python:sonde //server:sonde-collector
  PYTHONPATH=client/python:bazel-out/k8-opt/bin/client/python:examples \\
      /usr/bin/python3 examples/bench/hook_overhead.py \\
      --collector_binary bazel-out/k8-opt/bin/server/sonde-collector

Two models train on scikit-learn's digits with SGD (batch 32), each one
thread (torch.set_num_threads(1), so the second core is left to the hook's
threads and the collector): the example's DigitsCNN (~0.2M parameters) and
an MLP 64-1024-1024-1024-10 (~2.2M parameters; Debian's PyTorch uses a
generic BLAS, ~2 GFLOP/s on one thread here, so larger ones take seconds a
step). Each is measured without a
hook (baseline) and with a hook at save_interval 1, 10 and 100 that saves
the collections weights, biases, gradients and losses as raw float32 values
(no reductions, no rules) to a real sonde-collector on this machine (its
first stdout line is its address; its data directory is temporary).

A block runs every variant of a model once, in a rotating order; a variant
is a fresh model, hook, job and collector (on its own temporary directory,
removed afterwards), a few warm-up steps, then `steps` timed steps (a
multiple of 100, so every save interval saves the same share of them; at
save_interval 1 only --steps_at_1, as the MLP then saves 17 MB a step). The
hook's close, which waits until the collector has stored everything, is
not timed. The result of a variant is the median over blocks of its mean step
time; its ratio is the median over blocks of (its time / the baseline's time
in the same block), which cancels slow drifts of the shared machine.
--profile runs one variant under cProfile instead and prints where the
time goes.
"""

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import torch
import torch.nn as nn

import pytorch_digits
import sonde
import sonde.torch as smd

SAVE_INTERVALS = (1, 10, 100)
COLLECTIONS = ["weights", "biases", "gradients", "losses"]


class WideMLP(nn.Module):
    """The larger model: 64-1024-1024-1024-10, ReLU, ~2.2M parameters."""

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


# name: (model class, timed steps per variant)
MODELS = {"digits": (pytorch_digits.DigitsCNN, 300), "mlp": (WideMLP, 100)}


def batches(seed, batch_size=32):
    """Endless shuffled training batches of the digits."""
    (x, y), _ = pytorch_digits.load_data(seed)
    g = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(y), generator=g)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            i = order[start:start + batch_size]
            yield x[i], y[i]


def measure(model_name, save_interval, collector_binary, steps, warmup, job):
    """Mean seconds per training step over `steps` steps after `warmup`
    (save_interval None: no hook)."""
    torch.manual_seed(0)
    model = MODELS[model_name][0]()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = batches(0)
    if save_interval is None:
        return timed_steps(model, loss_fn, optimizer, data, steps, warmup)
    with pytorch_digits.LocalCollector(collector_binary) as collector:
        hook = smd.Hook(collector=collector.address, job=job, include_collections=COLLECTIONS,
                        save_config=smd.SaveConfig(save_interval=save_interval))
        hook.register_module(model)
        hook.register_loss(loss_fn)
        if not hook.wait_until_connected(30):
            raise RuntimeError("collector %s did not accept %s" % (collector.address, job))
        seconds = timed_steps(model, loss_fn, optimizer, data, steps, warmup)
        spilled = hook.counters().get("bytes_spilled", 0)
        hook.close()
        if spilled:
            print("  (%s: the hook's queue was full; %.0f MB spilled to disk)"
                  % (job, spilled / 1e6))
        return seconds


def timed_steps(model, loss_fn, optimizer, data, steps, warmup):
    for step in range(warmup + steps):
        if step == warmup:
            started = time.perf_counter()
        x, y = next(data)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    return (time.perf_counter() - started) / steps


def run_blocks(models, blocks, steps, steps_at_1, warmup, collector_binary, log=print):
    """{model: {variant: [seconds per step, one per block]}}, variants
    None (baseline) and each save interval, in a rotating order per block."""
    variants = [None] + list(SAVE_INTERVALS)
    times = {m: {v: [] for v in variants} for m in models}
    for block in range(blocks):
        for model_name in models:
            order = variants[block % len(variants):] + variants[:block % len(variants)]
            for v in order:
                job = "bench-%s-%s-b%d-%d" % (model_name, v or "none", block, os.getpid())
                n = steps_at_1 if v == 1 else steps or MODELS[model_name][1]
                t = measure(model_name, v, collector_binary, n, warmup, job)
                times[model_name][v].append(t)
                log("block %d %-6s %-9s %8.3f ms/step" % (
                    block, model_name, "baseline" if v is None else "every %d" % v, t * 1e3))
    return times


def report(times, models, out=sys.stdout):
    params = {m: sum(p.numel() for p in MODELS[m][0]().parameters()) for m in models}
    print("\n%-7s %9s %13s  %s" % ("model", "params", "baseline ms", "  ".join(
        "every %-3d ms (ratio, range)  " % si for si in SAVE_INTERVALS)), file=out)
    for m in models:
        base = times[m][None]
        cells = []
        for si in SAVE_INTERVALS:
            ratios = [t / b for t, b in zip(times[m][si], base)]
            cells.append("%7.3f (%.3f, %.3f-%.3f)" % (statistics.median(times[m][si]) * 1e3,
                                                      statistics.median(ratios), min(ratios),
                                                      max(ratios)))
        print("%-7s %8.2fM %13.3f  %s" % (m, params[m] / 1e6, statistics.median(base) * 1e3,
                                          "  ".join(cells)), file=out)


def profile(model_name, save_interval, collector_binary, steps, warmup, top):
    """Runs one variant under cProfile and prints the costliest functions."""
    profiler = cProfile.Profile()
    profiler.enable()
    t = measure(model_name, save_interval, collector_binary, steps, warmup,
                "bench-profile-%s-%s-%d" % (model_name, save_interval, os.getpid()))
    profiler.disable()
    print("%s, save_interval %s: %.3f ms/step under cProfile" % (model_name, save_interval,
                                                                t * 1e3))
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    print(text.getvalue())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="digits,mlp", help="comma-separated: digits, mlp")
    p.add_argument("--blocks", type=int, default=7)
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per variant, a multiple of 100 (default: digits 300, "
                   "mlp 100)")
    p.add_argument("--steps_at_1", type=int, default=50,
                   help="timed steps per variant at save_interval 1")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--collector_binary", default=None,
                   help="default: $SONDE_COLLECTOR_BINARY, the runfiles' or bazel-bin's")
    p.add_argument("--profile", metavar="MODEL:SAVE_INTERVAL",
                   help="profile one variant (e.g. mlp:100) instead of the table")
    args = p.parse_args(argv)
    if args.steps is not None and args.steps % 100:
        p.error("--steps must be a multiple of 100")
    models = args.models.split(",")
    for m in models:
        if m not in MODELS:
            p.error("unknown model %r" % m)
    args.collector_binary = args.collector_binary or pytorch_digits.find_collector_binary()
    torch.set_num_threads(args.threads)
    print("torch %s, %d thread(s); extension %s; collector %s" % (
        torch.__version__, torch.get_num_threads(), sonde._sonde.__file__,
        os.path.realpath(args.collector_binary)))
    if args.profile:
        model_name, si = args.profile.split(":")
        profile(model_name, None if si == "none" else int(si), args.collector_binary,
                args.steps or MODELS[model_name][1], args.warmup, top=25)
        return 0
    times = run_blocks(models, args.blocks, args.steps, args.steps_at_1, args.warmup,
                       args.collector_binary)
    report(times, models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
