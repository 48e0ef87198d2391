"""examples/pytorch_digits.py and analyze_trial.py against a real collector.

Each test runs the example as a user would (a /usr/bin/python3 process),
with the rules coming from the hook's `rules=` option (the collector runs
none of its own), and checks the outcome from what the collector stored,
through sonde.trials: the rule results, the job's status and its steps.
"""

import os
import struct
import subprocess

import pytest

from sonde import modes
from sonde.trials import create_trial
from sonde_pytest import Collector, runfile

DIGITS = runfile("examples/pytorch_digits.py")
ANALYZE = runfile("examples/analyze_trial.py")
EPOCHS = 2
STEPS_PER_EPOCH = 45  # 1438 training images in batches of 32
SAVE_INTERVAL = 2     # the example's default
RULES = {"ExplodingTensor", "VanishingGradient", "DeadRelu", "LossNotDecreasing",
         "PoorWeightInitialization"}


def run_python(*args):
    env = dict(os.environ, MPLCONFIGDIR=os.environ.get("TEST_TMPDIR", "/tmp"))
    return subprocess.run(["/usr/bin/python3"] + list(args), capture_output=True, text=True,
                          timeout=240, env=env)


def digits(address, job, config, *extra):
    """Runs the example; its exit code says the outcome was the expected one."""
    p = run_python(DIGITS, "--collector", address, "--job", job, "--config", config,
                   "--epochs", str(EPOCHS), *extra)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def stored(address, job):
    """(rule results by rule, job status, saved TRAIN mode steps)."""
    with create_trial(address, job) as trial:
        results = {r["rule"]: r for r in trial.rule_results()}
        return results, trial.job_status(), trial.steps(mode=modes.TRAIN)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    """One healthy run, shared by the tests that read it."""
    tmp = tmp_path_factory.mktemp("healthy")
    collector = Collector(tmp / "db", rules="")
    try:
        report = tmp / "report.html"
        out = digits(collector.address, "healthy", "healthy", "--report", str(report))
        yield collector.address, out, report
    finally:
        collector.stop()


def test_healthy_run_trains_to_the_end_and_every_rule_finds_no_issues(healthy):
    address, out, _ = healthy
    results, status, steps = stored(address, "healthy")
    assert set(results) == RULES | {"ProfilerReport"}  # profiled: --report
    assert {r: results[r]["status"] for r in RULES} == {r: "NoIssuesFound" for r in RULES}
    # It reports what it saw whatever it found (a shared machine may have slow steps).
    assert results["ProfilerReport"]["status"] in ("NoIssuesFound", "IssuesFound")
    assert results["ProfilerReport"]["datapoints"] > 0
    assert status == "Finished"
    assert steps[-1] == EPOCHS * STEPS_PER_EPOCH - SAVE_INTERVAL
    assert "not stopped" in out
    accuracy = float(out.split("final test accuracy: ")[1].split()[0])
    assert accuracy >= 0.9


def test_a_profiled_run_writes_its_report(healthy):
    address, out, report = healthy
    assert "report (profiler and rules, HTML): %s" % report in out
    html = report.read_text(encoding="utf-8")
    assert '<span id="job-name">healthy</span>' in html
    # Step timings from the profiler: every TRAIN step of the run.
    assert "from profiler step events" in html
    assert '<td>train</td><td class="n">%d</td>' % (EPOCHS * STEPS_PER_EPOCH) in html
    assert ">CPU utilisation<" in html and "<svg" in html
    for rule in RULES:
        assert "<td>%s</td>" % rule in html
    profiler_table = html.split('id="profiler-rules-table"')[1].split("</table>")[0]
    assert "<td>ProfilerReport</td>" in profiler_table
    with create_trial(address, "healthy") as trial:
        assert trial.report().split("Generated")[0] == html.split("Generated")[0]


# config, rules asked for (None: the example's), the rule that must stop it,
# and the saved TRAIN step where it must find the issue.
BROKEN = [
    ("exploding_lr", None, "DeadRelu", 2),  # the ReLUs die at step 1, before the overflow
    ("exploding_lr", "ExplodingTensor(actions=StopTraining)", "ExplodingTensor", 4),
    ("dead_relu", None, "DeadRelu", 0),
    ("vanishing_gradient", None, "VanishingGradient", 0),
]


@pytest.mark.parametrize("config,rules,rule,step", BROKEN,
                         ids=["%s-%s" % (c, r) for c, _, r, _ in BROKEN])
def test_broken_run_is_stopped_early_by_the_rule_that_sees_it_first(
        start_collector, config, rules, rule, step):
    collector = start_collector(rules="")
    extra = ["--rules", rules] if rules else []
    out = digits(collector.address, config, config, *extra)
    results, status, steps = stored(collector.address, config)
    assert results[rule]["status"] == "IssuesFound", results[rule]
    assert results[rule]["step"] == step, results[rule]
    assert "StopTraining" in results[rule]["actions_taken"]
    # No rule found anything earlier: the stop came from the first symptom.
    assert all(r["step"] >= step for r in results.values() if r["status"] == "IssuesFound")
    assert status == "Stopped"
    assert steps[-1] < STEPS_PER_EPOCH  # within the first epoch of two
    assert "stopped by %s" % rule in out


def test_analysis_plots_loss_and_gradient_norm_to_a_png_and_prints_the_summary(
        healthy, tmp_path):
    address, _, _ = healthy
    png = tmp_path / "digits.png"
    p = run_python(ANALYZE, "--collector", address, "--job", "healthy", "--out", str(png))
    assert p.returncode == 0, p.stdout + p.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == (800, 600)  # 8x6 inches at 100 dpi
    assert len(data) > 20000  # two panels of curves, not an empty canvas
    assert "loss in TRAIN, EVAL" in p.stdout
    assert "rule_job_summary() of healthy" in p.stdout
    for rule in RULES:
        assert any(line.split()[:2] == [rule, "NoIssuesFound"] for line in p.stdout.splitlines())
