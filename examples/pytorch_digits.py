#!/usr/bin/python3
"""A small CNN on scikit-learn's handwritten digits, debugged live by Sonde.

  /usr/bin/python3 examples/pytorch_digits.py --collector 127.0.0.1:7070 --config healthy
  bazel run //examples:pytorch_digits -- --embedded --config dead_relu

The model, data and loop are ordinary PyTorch; Sonde adds the hook
(`smd.Hook`, registered on the model and the loss) and asks the collector
for SageMaker's rules with the hook's `rules=` option (`--rules`, default
RULES below). One healthy and three broken configurations:

  healthy             SGD lr=0.02 (momentum 0.9), He initialisation: every rule
                      ends NoIssuesFound, test accuracy >= 0.9.
  exploding_lr        SGD lr=50: half of fc2's ReLUs die at TRAIN step 1 and the
                      values overflow to Inf and NaN at step 3. DeadRelu sees it
                      first; asked for alone (--rules), ExplodingTensor stops it
                      at the first saved step from 3 on.
  dead_relu           fc1's biases at -30 for 224 of its 256 units: they never
                      fire (DeadRelu at step 0).
  vanishing_gradient  weights N(0, 1e-3) in every layer: gradients near 1e-9
                      (VanishingGradient at step 0).

CONFIGS lists, per configuration, the TRAIN step at which each rule first
sees the problem (measured with seeds 0-3; the same for each). The run is
expected to be stopped by the StopTraining rule asked for that sees it at the
earliest saved step, and the exit code is 0 when that is what happened.
"""

import argparse
import collections
import re
import sys
import time

import torch
import torch.nn as nn
from sklearn.datasets import load_digits

import sonde.torch as smd
from sonde import modes
from sonde.testing import Collector

# The rules this example asks for, in the collector's --rules syntax. The
# three that catch a broken configuration stop training. Two only report:
# LossNotDecreasing, on the EVAL loss (one value per epoch: per-batch TRAIN
# losses are too noisy to compare step with step), and
# PoorWeightInitialization (the ReLUs' input variances, the gradients'
# spread and the loss over the first 10 steps), which also finds each broken
# run but fires at the same step as the rule that stops it.
RULES = ";".join([
    "ExplodingTensor(actions=StopTraining)",
    "VanishingGradient(actions=StopTraining)",
    "DeadRelu(actions=StopTraining)",
    "LossNotDecreasing(mode=EVAL,num_steps=1)",
    "PoorWeightInitialization",
])

Config = collections.namedtuple("Config", "lr init symptoms")
CONFIGS = {
    "healthy": Config(0.02, "he", {}),
    # A ReLU network dies of a large learning rate before it overflows: the
    # first update pushes half of fc2's units below zero for every input,
    # and only two steps later do the activations reach Inf and NaN (and
    # the dead layers' gradients become exact zeros).
    "exploding_lr": Config(50.0, "he", {"DeadRelu": 1, "VanishingGradient": 3,
                                        "ExplodingTensor": 3}),
    "dead_relu": Config(0.02, "dead_relu", {"DeadRelu": 0}),
    # The first update moves fc2's biases (~1e-5) far more than its tiny
    # weights move its inputs (~1e-8): half of its units go dark at step 1.
    "vanishing_gradient": Config(0.02, "tiny", {"VanishingGradient": 0, "DeadRelu": 1}),
}

# A healthy run's test accuracy: 0.9 from its second epoch on; after one
# epoch (--epochs 1) the CNN is at about 0.89, so 0.8 there.
HEALTHY_ACCURACY = 0.9
HEALTHY_ACCURACY_ONE_EPOCH = 0.8
DEAD_RELU_ALIVE = 32  # fc1 units the dead_relu initialisation leaves alive


class DigitsCNN(nn.Module):
    """Two convolutions and two hidden fully connected layers for 8x8 digits
    (about 200k parameters).

    Every activation is its own nn.ReLU module named `<layer>_relu`, so the
    hook saves `fc1_relu_output_0` and `fc1_relu_input_0`, which DeadRelu's
    and PoorWeightInitialization's default regexes (`.*relu_output`,
    `.*relu_input`) match.
    """

    def __init__(self, width=256):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv1_relu = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.conv2_relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(32 * 4 * 4, width)
        self.fc1_relu = nn.ReLU()
        self.fc2 = nn.Linear(width, width)
        self.fc2_relu = nn.ReLU()
        self.out = nn.Linear(width, 10)

    def forward(self, x):
        x = self.conv1_relu(self.conv1(x))
        x = self.pool(self.conv2_relu(self.conv2(x)))
        x = self.fc1_relu(self.fc1(x.flatten(1)))
        x = self.fc2_relu(self.fc2(x))
        return self.out(x)


def initialise(model, how):
    """He initialisation with zero biases (the healthy choice for ReLU
    layers), or one of the broken ones."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)
        if how == "dead_relu":
            # fc1's pre-activations stay within about +-10 for these inputs;
            # a bias of -30 holds 224 of its 256 units below zero for every
            # sample, so they output 0 and get no gradient to recover.
            model.fc1.bias[DEAD_RELU_ALIVE:] = -30.0
        elif how == "tiny":
            # Every layer scales its input by about 1e-3 * sqrt(fan_in) <= 0.03,
            # forward and backward: five layers leave gradients near 1e-9.
            for m in model.modules():
                if isinstance(m, (nn.Conv2d, nn.Linear)):
                    nn.init.normal_(m.weight, std=1e-3)
        elif how != "he":
            raise ValueError("unknown initialisation %r" % how)


def load_data(seed, test_fraction=0.2):
    """Digits as [N, 1, 8, 8] float tensors, standardised per pixel with the
    training split's statistics, and the labels; split once by `seed`."""
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    mean, std = x[train].mean(0), x[train].std(0).clamp(min=1.0)  # pixels are 0..16
    x = (x - mean) / std
    return (x[train], y[train]), (x[test], y[test])


def make_hook(collector, job, save_interval, rules=RULES, profile=False):
    """The hook: weights, biases, gradients, the loss and every ReLU's input
    and output, every `save_interval` TRAIN steps and every EVAL step; with
    `profile`, the profiler too (system metrics every 500 ms, step, forward
    and backward timings)."""
    hook = smd.Hook(
        collector=collector, job=job, rules=rules, profiler=bool(profile),
        save_config=smd.SaveConfig(
            save_interval=save_interval,
            mode_save_configs={modes.EVAL: smd.SaveConfigMode(save_interval=1)}),
        include_collections=["weights", "biases", "gradients", "losses", "relu"])
    hook.get_collection("relu").include([".*relu_input", ".*relu_output"])
    return hook


def train(hook, model, data, lr, epochs, seed, batch_size=32, log=print):
    """SGD with momentum; an EVAL pass over the test set (one batch) after
    each epoch. Returns (TRAIN steps run, test accuracy per epoch)."""
    (x_train, y_train), (x_test, y_test) = data
    loss_fn = nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    shuffle = torch.Generator().manual_seed(seed)
    steps, accuracies = 0, []
    for epoch in range(epochs):
        hook.set_mode(modes.TRAIN)
        model.train()
        order = torch.randperm(len(y_train), generator=shuffle)
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
            steps += 1
            if hook.should_stop():
                return steps, accuracies
        hook.set_mode(modes.EVAL)
        model.eval()
        with torch.no_grad():
            logits = model(x_test)
            test_loss = loss_fn(logits, y_test).item()
            accuracy = (logits.argmax(1) == y_test).float().mean().item()
        accuracies.append(accuracy)
        log("epoch %d: train loss %.4f, test loss %.4f, test accuracy %.3f"
            % (epoch, loss.item(), test_loss, accuracy))
    return steps, accuracies


def final_rule_results(address, job, timeout=30.0):
    """The job's rule results once none is InProgress (rules settle just
    after the job ends), as dicts from sonde.trials."""
    from sonde.trials import create_trial  # only needed after training
    with create_trial(address, job) as trial:
        deadline = time.monotonic() + timeout
        while True:
            results = trial.rule_results()
            if all(r["status"] != "InProgress" for r in results) or time.monotonic() > deadline:
                return results
            time.sleep(0.1)


def stopping_rules(rules):
    """{rule name: rule type} of the rules in a --rules string whose actions
    include StopTraining (a rule's name is its type unless name= says)."""
    out = {}
    for spec in filter(None, (part.strip() for part in rules.split(";"))):
        match = re.fullmatch(r"(\w+)\s*(?:\((.*)\))?", spec)
        if not match:
            raise ValueError("cannot read rule %r" % spec)
        params = dict(kv.split("=", 1) for kv in filter(None, (match.group(2) or "").split(",")))
        params = {k.strip(): v.strip() for k, v in params.items()}
        if "StopTraining" in params.get("actions", "").split("|"):
            out[params.get("name", match.group(1))] = match.group(1)
    return out


def expected_stoppers(config, rules, save_interval):
    """The rules that should stop `config`: of the StopTraining rules asked
    for, those that see its problem at the earliest saved TRAIN step (steps
    0, save_interval, 2 * save_interval, ... are saved)."""
    symptoms = CONFIGS[config].symptoms
    seen = {name: -(-symptoms[kind] // save_interval) * save_interval
            for name, kind in stopping_rules(rules).items() if kind in symptoms}
    first = min(seen.values(), default=None)
    return sorted(name for name, step in seen.items() if step == first)


def judge(summary, rules, save_interval):
    """Why the outcome is not the one the configuration expects (empty: it is)."""
    # ProfilerReport (asked for with --report) reports; it does not judge the run.
    status = {r["rule"]: r["status"] for r in summary["rules"] if r["rule"] != "ProfilerReport"}
    stopped_by = summary["stopped_by"]
    expected = expected_stoppers(summary["config"], rules, save_interval)
    problems = []
    if not expected:
        if stopped_by is not None:
            problems.append("stopped by %s" % stopped_by)
        if summary["config"] == "healthy":
            problems += ["%s is %s" % (rule, s) for rule, s in sorted(status.items())
                         if s != "NoIssuesFound"]
            accuracy = summary["accuracy"]
            wanted = (HEALTHY_ACCURACY_ONE_EPOCH if summary.get("epochs", 0) <= 1
                      else HEALTHY_ACCURACY)
            if accuracy is None or accuracy < wanted:
                problems.append("test accuracy %s < %s" % (
                    "n/a" if accuracy is None else "%.3f" % accuracy, wanted))
        else:
            problems.append("no StopTraining rule asked for catches %s" % summary["config"])
    else:
        if stopped_by not in expected:
            problems.append("expected a stop by %s, got %s" % (" or ".join(expected), stopped_by))
        elif status.get(stopped_by) != "IssuesFound":
            problems.append("%s is %s, not IssuesFound" % (stopped_by, status.get(stopped_by)))
    return problems


def run(collector, job, config, epochs=4, save_interval=2, seed=0, rules=RULES, log=print,
        report=None):
    """Trains one configuration against `collector`; returns a summary dict.
    With `report` (a path), the profiler is on, ProfilerReport runs beside
    the rules (it reports, and does not count towards the outcome), and the
    job's HTML report is written there after training."""
    lr, init, _ = CONFIGS[config]
    torch.manual_seed(seed)
    model = DigitsCNN()
    initialise(model, init)
    data = load_data(seed)
    hook = make_hook(collector, job, save_interval,
                     rules if report is None else rules + ";ProfilerReport",
                     profile=report is not None)
    if not hook.wait_until_connected(30):
        raise RuntimeError("the collector at %s did not accept job %r" % (collector, job))
    started = time.monotonic()
    steps, accuracies = train(hook, model, data, lr, epochs, seed, log=log)
    seconds = time.monotonic() - started
    action = hook.stop_action()
    hook.close()
    summary = {
        "job": job,
        "config": config,
        "steps": steps,
        "seconds": seconds,
        "stopped_by": action["rule"] if action else None,
        "stop_step": action.get("step") if action else None,
        "accuracy": accuracies[-1] if accuracies else None,
        "epochs": len(accuracies),
        "rules": final_rule_results(collector, job),
    }
    summary["problems"] = judge(summary, rules, save_interval)
    if report is not None:
        from sonde.trials import create_trial
        with create_trial(collector, job) as trial:
            html = trial.report()
        with open(report, "w", encoding="utf-8") as f:
            f.write(html)
        summary["report"] = report
        if "<svg" not in html or "Step durations" not in html:
            summary["problems"].append("the report at %s has no charts" % report)
    return summary


def print_summary(s, out=sys.stdout):
    print("\n== %s (%s)" % (s["job"], s["config"]), file=out)
    print("TRAIN steps run: %d in %.1f s" % (s["steps"], s["seconds"]), file=out)
    if s["stopped_by"]:
        print("stopped by %s (issue at step %s)" % (s["stopped_by"], s["stop_step"]), file=out)
    else:
        print("not stopped", file=out)
    acc = s["accuracy"]
    print("final test accuracy: %s" % ("%.3f" % acc if acc is not None else "n/a"), file=out)
    print("rules:", file=out)
    for r in s["rules"]:
        where = " at step %d" % r["step"] if r["status"] == "IssuesFound" else ""
        print("  %-24s %-13s%s %s" % (r["rule"], r["status"], where, r["message"]), file=out)
    if s.get("report"):
        print("report (profiler and rules, HTML): %s" % s["report"], file=out)
    if s["problems"]:
        print("UNEXPECTED: " + "; ".join(s["problems"]), file=out)
    else:
        print("outcome as expected for %s" % s["config"], file=out)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--collector", help="host:port of a running sonde-collector")
    p.add_argument("--embedded", action="store_true",
                   help="start a collector on a temporary directory for this run")
    p.add_argument("--job", help="job name (default: digits-CONFIG-TIME)")
    p.add_argument("--config", choices=sorted(CONFIGS), default="healthy")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--save_interval", type=int, default=2,
                   help="save every N TRAIN steps (every EVAL step is saved); from 3 up, "
                   "exploding_lr's dying and overflowing steps are judged as one and "
                   "any of the three rules may stop it")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rules", default=RULES, help="rules to ask for (default: %(default)s)")
    p.add_argument("--report", metavar="PATH",
                   help="turn the profiler on and write the job's HTML report to PATH")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1 keeps the numbers, and so the outcome, reproducible)")
    args = p.parse_args(argv)
    if not args.collector and not args.embedded:
        p.error("give --collector host:port or --embedded")
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    job = args.job or "digits-%s-%d" % (args.config, int(time.time()))
    options = dict(epochs=args.epochs, save_interval=args.save_interval, seed=args.seed,
                   rules=args.rules, report=args.report)
    if args.embedded:
        with Collector() as collector:
            print("collector on %s" % collector.address)
            summary = run(collector.address, job, args.config, **options)
    else:
        summary = run(args.collector, job, args.config, **options)
    print_summary(summary)
    return 0 if not summary["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
