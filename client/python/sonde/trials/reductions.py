"""smdebug's reductions: from a tensor's values, or from the statistics the
collector stores for every tensor (all that exists when only reductions
were saved).

From values the answer is numpy's, as smdebug computes it (np.amin, np.amax,
np.mean, np.std, np.var, np.sum, np.prod of the array, or of its absolute
value with abs=True), except the norms: l1 and l2 are vector norms of the
flattened tensor (smdebug hands np.linalg.norm the array as it is, which
gives a matrix norm for 2-D tensors and fails beyond).

From statistics the answer is what numpy would say of the values, so both
ways agree: a NaN anywhere makes every reduction NaN, infinities propagate
as in numpy (an Inf makes mean and sum infinite, or NaN with both signs;
variance and std NaN; norms infinite). The statistics keep their sums over
finite elements, so this is exact in meaning though sums may differ from
numpy's in the last bits. `prod` cannot be answered from statistics.
abs variance and std come from E[x^2] - E[|x|]^2 when the tensor has both
signs (when it has one sign they equal the plain ones).
"""

import math

import numpy as np

REDUCTIONS = ("min", "max", "mean", "std", "variance", "sum", "prod", "l1", "l2")
FROM_STATISTICS = tuple(r for r in REDUCTIONS if r != "prod")


def check_name(name):
    if name not in REDUCTIONS:
        raise ValueError("unknown reduction '{}'; smdebug's are {}".format(
            name, ", ".join(REDUCTIONS)))


_NUMPY = {"min": np.amin, "max": np.amax, "mean": np.mean, "std": np.std, "variance": np.var,
          "sum": np.sum, "prod": np.prod}


def from_values(name, array, abs=False):
    check_name(name)
    data = np.absolute(array) if abs else array
    if name in ("l1", "l2"):
        return np.linalg.norm(np.ravel(data), ord=1 if name == "l1" else 2)
    return _NUMPY[name](data)


def from_statistics(name, stats, abs=False):
    """np.float64, or None when the statistics cannot answer (prod)."""
    check_name(name)
    if name == "prod":
        return None
    n = stats.count
    if n == 0:
        if name in ("min", "max"):
            raise ValueError("{} of an empty tensor".format(name))
        return np.float64(0.0 if name in ("sum", "l1", "l2") else math.nan)
    if stats.nan_count:
        return np.float64(math.nan)
    pos_inf = stats.pos_inf_count > 0
    neg_inf = stats.neg_inf_count > 0
    inf = pos_inf or neg_inf
    finite = stats.finite_count
    if name == "l1" or (abs and name == "sum"):
        value = math.inf if inf else stats.l1
    elif name == "l2":
        value = math.inf if inf else math.sqrt(stats.sum_squares)
    elif name == "min":
        value = stats.abs_min if abs else stats.min
    elif name == "max":
        value = stats.abs_max if abs else stats.max
    elif name in ("sum", "mean"):
        if abs:
            value = math.inf if inf else stats.l1 / n
        elif pos_inf and neg_inf:
            value = math.nan
        elif inf:
            value = math.inf if pos_inf else -math.inf
        else:
            value = stats.sum if name == "sum" else stats.sum / finite
    else:  # variance, std
        if inf:
            value = math.nan
        elif abs and stats.min < 0 < stats.max:
            mean_abs = stats.l1 / finite
            value = max(0.0, stats.sum_squares / finite - mean_abs * mean_abs)
        else:
            value = stats.m2 / finite
        if name == "std":
            value = math.sqrt(value)
    return np.float64(value)
