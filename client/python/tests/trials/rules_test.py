"""rule_results() and rule_job_summary() report what the collector's rules
concluded: ExplodingTensor finds the NaN a worker sent, and a clean job ends
NoIssuesFound."""

import datetime

import numpy as np
import pytest

from raw_ingest import Worker, wait_for_rule_verdicts
from sonde.modes import ModeKeys


def train(address, job, nan_at=None, steps=4):
    w = Worker(address, job)
    for step in range(steps):
        weight = np.full((2, 3), 0.5 * step, dtype=np.float32)
        if step == nan_at:
            weight[1, 2] = np.nan
        w.step(step, {"fc.weight": weight, "loss": np.array(1.0 / (step + 1))},
               mode=ModeKeys.TRAIN, mode_step=step, collections=["weights"])
    w.end_job()
    wait_for_rule_verdicts(address, job)


@pytest.fixture
def rules_collector(start_collector):
    return start_collector(rules="ExplodingTensor")


def test_rule_results_report_the_issue_and_where(rules_collector, open_trial):
    train(rules_collector.address, "exploding", nan_at=2)
    trial = open_trial(rules_collector.address, "exploding")
    results = trial.rule_results()
    assert len(results) == 1
    r = results[0]
    assert (r["job"], r["rule"], r["rule_type"]) == ("exploding", "ExplodingTensor",
                                                     "ExplodingTensor")
    assert r["status"] == "IssuesFound"
    assert (r["step"], r["mode"], r["mode_step"], r["worker"]) == (2, ModeKeys.TRAIN, 2, 0)
    assert r["tensors"] == ["fc.weight"]
    assert r["message"] == "tensor 'fc.weight' at TRAIN step 2 has 1 NaN and 0 Inf of 6 values"
    assert (r["observed"], r["steps_evaluated"], r["actions_taken"]) == (1.0, 3, [])
    assert isinstance(r["time"], datetime.datetime) and r["time"].tzinfo is not None
    assert abs(datetime.datetime.now(datetime.timezone.utc) - r["time"]) < datetime.timedelta(
        minutes=5)
    assert set(r) == {"job", "rule", "rule_type", "status", "step", "mode", "mode_step",
                      "worker", "tensors", "message", "suggestion", "observed", "threshold",
                      "steps_evaluated", "datapoints", "times_triggered", "actions_taken",
                      "time"}
    assert (r["datapoints"], r["times_triggered"]) == (0, 1)  # a tensor rule: stops at its issue


def test_rule_job_summary_is_shaped_like_sagemakers(rules_collector, open_trial):
    train(rules_collector.address, "exploding", nan_at=1)
    train(rules_collector.address, "clean")
    bad = open_trial(rules_collector.address, "exploding").rule_job_summary()
    good = open_trial(rules_collector.address, "clean").rule_job_summary()
    for summary in (bad, good):
        assert len(summary) == 1
        assert set(summary[0]) == {"RuleConfigurationName", "RuleEvaluationStatus",
                                   "StatusDetails", "LastModifiedTime"}
        assert summary[0]["RuleConfigurationName"] == "ExplodingTensor"
        assert summary[0]["LastModifiedTime"].tzinfo is datetime.timezone.utc
    assert bad[0]["RuleEvaluationStatus"] == "IssuesFound"
    assert bad[0]["StatusDetails"].startswith(
        "RuleEvaluationConditionMet: Evaluation of the rule ExplodingTensor at step 1 "
        "resulted in the condition being met: tensor 'fc.weight' at TRAIN step 1 has 1 NaN")
    assert good[0]["RuleEvaluationStatus"] == "NoIssuesFound"


def test_a_job_without_rules_has_no_results(collector, open_trial):
    train(collector.address, "norules")
    trial = open_trial(collector.address, "norules")
    assert trial.rule_results() == [] and trial.rule_job_summary() == []
