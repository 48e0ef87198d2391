"""What Sonde's CPU statistics cost with numpy: the same numbers from
separate numpy calls on a float32 array of normal values.

Run by //stats:stats_bench, which reads the last line,
`numpy_seconds STATS HISTOGRAM`: the median time of the statistics calls and
of np.histogram, in seconds. Accumulations are in float64 where numpy offers
it (as Sonde's are); the sum of squares uses np.dot in float32 (BLAS), the
fastest numpy way, so the comparison errs in numpy's favour.
"""

import argparse
import statistics
import time

import numpy as np


def stats_calls(a):
    nan = np.count_nonzero(np.isnan(a))
    pos_inf = np.count_nonzero(np.isposinf(a))
    neg_inf = np.count_nonzero(np.isneginf(a))
    zeros = np.count_nonzero(a == 0)
    mn = a.min()
    mx = a.max()
    ab = np.abs(a)
    amn = ab.min()
    amx = ab.max()
    total = a.sum(dtype=np.float64)
    l1 = ab.sum(dtype=np.float64)
    sq = np.dot(a, a)
    var = a.var(dtype=np.float64)
    return nan, pos_inf, neg_inf, zeros, mn, mx, amn, amx, total, l1, sq, var


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=256, help="array size in MiB")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--bins", type=int, default=64)
    args = parser.parse_args()

    n = args.mb * (1 << 20) // 4
    a = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    stats_times, hist_times = [], []
    for _ in range(max(1, args.reps)):
        t0 = time.perf_counter()
        stats_calls(a)
        t1 = time.perf_counter()
        np.histogram(a, bins=args.bins, range=(-4.0, 4.0))
        t2 = time.perf_counter()
        stats_times.append(t1 - t0)
        hist_times.append(t2 - t1)
    print("numpy_seconds %.6f %.6f" % (statistics.median(stats_times),
                                       statistics.median(hist_times)))


if __name__ == "__main__":
    main()
