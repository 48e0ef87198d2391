#!/usr/bin/python3
"""Plots a job's loss and one gradient's L2 norm, and prints its rule summary.

  /usr/bin/python3 examples/analyze_trial.py --collector 127.0.0.1:7070 \
      --job digits-healthy-1700000000 --out digits.png
  bazel run //examples:analyze_trial -- --collector ... --job ... --out $PWD/digits.png

It reads the job through sonde.trials, smdebug's Trial API: the loss
`CrossEntropyLoss_output_0` at every saved TRAIN and EVAL step (on one axis
of global steps) and the L2 norm of a gradient (`reduction_value(step,
"l2")`, from the stored statistics when only those were saved), then
prints rule_job_summary() as SageMaker's estimator shows it.
"""

import argparse
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from sonde import modes  # noqa: E402
from sonde.trials import create_trial  # noqa: E402

LOSS = "CrossEntropyLoss_output_0"
GRADIENT = "gradient/DigitsCNN_fc1.weight"


def series(trial, name, mode, measure):
    """(global steps, measure(tensor, mode step, mode)) at every saved step
    of the mode."""
    tensor = trial.tensor(name)
    steps, values = [], []
    for mode_step in tensor.steps(mode=mode):
        steps.append(trial.global_step(mode, mode_step))
        values.append(measure(tensor, mode_step, mode))
    return steps, values


def loss_value(tensor, step, mode):
    return float(tensor.value(step, mode=mode))


def l2_norm(tensor, step, mode):
    return tensor.reduction_value(step, "l2", mode=mode)


def pick_gradient(trial, wanted):
    """`wanted` if the job saved it, else its first gradient by name."""
    if trial.has_tensor(wanted):
        return wanted
    gradients = sorted(trial.tensor_names(collection="gradients"))
    if not gradients:
        raise SystemExit("job %r saved no gradients" % trial.job)
    return gradients[0]


def plot(trial, gradient, out):
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 6))
    for mode, style in ((modes.TRAIN, "-"), (modes.EVAL, "o-")):
        steps, values = series(trial, LOSS, mode, loss_value)
        if steps:
            top.plot(steps, values, style, label="%s (%s)" % (LOSS, mode.name), markersize=4)
    top.set_ylabel("loss")
    top.set_yscale("log")
    top.legend()
    top.set_title("job %s" % trial.job)
    steps, norms = series(trial, gradient, modes.TRAIN, l2_norm)
    bottom.plot(steps, norms, "-", color="tab:red", label="L2 norm of %s" % gradient)
    bottom.set_ylabel("L2 norm")
    bottom.set_yscale("log")
    bottom.set_xlabel("global step")
    bottom.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return len(steps)


def print_summary(trial, out=sys.stdout):
    print("rule_job_summary() of %s:" % trial.job, file=out)
    for r in trial.rule_job_summary():
        print("  %-26s %-14s %s" % (r["RuleConfigurationName"], r["RuleEvaluationStatus"],
                                    r["StatusDetails"]), file=out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--collector", required=True, help="host:port of the sonde-collector")
    p.add_argument("--job", required=True)
    p.add_argument("--out", default="plot.png", help="PNG to write (default: %(default)s)")
    p.add_argument("--gradient", default=GRADIENT,
                   help="gradient whose L2 norm is plotted (default: %(default)s)")
    args = p.parse_args(argv)
    with create_trial(args.collector, args.job) as trial:
        gradient = pick_gradient(trial, args.gradient)
        saved = plot(trial, gradient, args.out)
        print("wrote %s: loss in %s, L2 norm of %s at %d steps"
              % (args.out, ", ".join(m.name for m in trial.modes()), gradient, saved))
        print_summary(trial)
    return 0


if __name__ == "__main__":
    sys.exit(main())
