"""Custom rules in Python (sonde.rules, smdebug's Rule and invoke_rule)
over real PyTorch training and a real collector: a rule that follows a
job live stops it with its StopTraining action; a rule run after the job
reports NoIssuesFound and sees only the saved steps; failures and
raise_eval_cond reach the caller and the collector."""

import threading
import time

import numpy as np
import pytest
import torch
import torch.nn as nn

import sonde.torch as smd
from sonde import modes
from sonde.rules import Rule, RuleEvaluationConditionMet, invoke_rule
from sonde.trials import create_trial

LIMIT = 1e6


class LossExplodes(Rule):
    """IssuesFound when a loss is not finite or larger than `limit`."""

    def __init__(self, base_trial, limit=LIMIT):
        super().__init__(base_trial)
        self.limit = float(limit)
        self.seen = []

    def invoke_at_step(self, step):
        self.seen.append(step)
        for name in self.base_trial.tensor_names(collection="losses"):
            v = self.base_trial.tensor(name).value(step)
            if not np.all(np.isfinite(v)) or np.abs(v).max() > self.limit:
                return True
        return False


def train(hook, steps, lr, pause=0.0):
    """An MLP on random data whose inputs are 10x too large: at lr=50 its
    loss explodes within a few steps. Returns the losses, one per step run;
    stops early when a rule stops the job."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    loss_fn = nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(steps):
        if hook.should_stop():
            break
        x, y = torch.randn(32, 8, generator=g) * 10, torch.randint(0, 4, (32,), generator=g)
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        time.sleep(pause)
    return losses


def first_bad(losses, saved=lambda s: True):
    return next(s for s, v in enumerate(losses) if saved(s) and not abs(v) <= LIMIT)


def status_of(trial, rule):
    return next(r for r in trial.rule_results() if r["rule"] == rule)


def test_a_live_rule_stops_the_training_it_follows(start_collector):
    collector = start_collector()
    hook = smd.Hook(collector=collector.address, job="live", strict=True,
                    save_config=smd.SaveConfig(save_interval=2), include_collections=["losses"])
    assert hook.wait_until_connected(10)
    trial = create_trial(collector.address, "live")
    rule = LossExplodes(trial)
    outcome = {}

    def run():
        try:
            outcome["met"] = invoke_rule(rule, actions=["StopTraining"], name="loss_explodes")
        except Exception as e:  # noqa: BLE001 - reported below
            outcome["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    losses = train(hook, steps=400, lr=50.0, pause=0.05)
    stopped = hook.should_stop()
    hook.close()
    thread.join(60)
    assert not thread.is_alive() and "error" not in outcome, outcome
    bad = first_bad(losses, saved=lambda s: s % 2 == 0)
    assert stopped and len(losses) < 400, len(losses)  # the rule's action ended training
    assert hook.stop_action()["rule"] == "loss_explodes"
    assert outcome["met"][0] == bad
    result = status_of(trial, "loss_explodes")
    assert (result["status"], result["step"]) == ("IssuesFound", bad)
    assert result["rule_type"] == "LossExplodes (custom)"
    assert result["actions_taken"] == ["StopTraining"]
    trial.close()


def test_a_rule_run_after_the_job_sees_only_saved_steps(start_collector):
    collector = start_collector()
    hook = smd.Hook(collector=collector.address, job="after", strict=True,
                    save_config=smd.SaveConfig(save_interval=3), include_collections=["losses"])
    losses = train(hook, steps=12, lr=0.01)
    hook.close()
    with create_trial(collector.address, "after") as trial:
        rule = LossExplodes(trial)
        assert invoke_rule(rule) == []
        assert rule.seen == [0, 3, 6, 9]
        assert max(abs(v) for v in losses) < LIMIT
        result = status_of(trial, "LossExplodes")
        assert (result["status"], result["step"]) == ("NoIssuesFound", 9)
        # start_step and end_step bound it, as in smdebug.
        again = LossExplodes(trial)
        invoke_rule(again, start_step=2, end_step=9, post=False)
        assert again.seen == [3, 6]


def test_conditions_and_failures_reach_the_caller_and_the_collector(start_collector):
    collector = start_collector()
    hook = smd.Hook(collector=collector.address, job="raise", strict=True,
                    save_config=smd.SaveConfig(save_interval=2), include_collections=["losses"])
    losses = train(hook, steps=10, lr=50.0)
    hook.close()
    bad = first_bad(losses, saved=lambda s: s % 2 == 0)
    with create_trial(collector.address, "raise") as trial:
        with pytest.raises(RuleEvaluationConditionMet) as e:
            invoke_rule(LossExplodes(trial), raise_eval_cond=True)
        assert (e.value.rule_name, e.value.step) == ("LossExplodes", bad)
        assert status_of(trial, "LossExplodes")["status"] == "IssuesFound"

        class Broken(Rule):
            def invoke_at_step(self, step):
                if step >= 4:
                    raise ZeroDivisionError("the rule's own bug")
                return False

        with pytest.raises(ZeroDivisionError):
            invoke_rule(Broken(trial))
        result = status_of(trial, "Broken")
        assert (result["status"], result["step"]) == ("Error", 4)
        assert "the rule's own bug" in result["message"]
        with pytest.raises(ValueError, match="Email"):
            invoke_rule(Broken(trial), actions=["Email"])
        with pytest.raises(NotImplementedError):
            invoke_rule(Rule(trial), post=False)


def test_a_mode_picks_its_steps_and_the_rule_still_gets_global_steps(start_collector):
    collector = start_collector()
    hook = smd.Hook(collector=collector.address, job="modes", strict=True,
                    save_config=smd.SaveConfig(save_interval=1), include_collections=["losses"])
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    loss_fn = nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    phases = []  # the mode of each global step, as the loop ran them
    for epoch in range(3):
        for mode, batches in ((modes.TRAIN, 3), (modes.EVAL, 1)):
            hook.set_mode(mode)
            for _ in range(batches):
                x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
                loss = loss_fn(model(x), y)
                if mode == modes.TRAIN:
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                phases.append(mode)
    hook.close()
    with create_trial(collector.address, "modes") as trial:
        rule = LossExplodes(trial)
        assert invoke_rule(rule, mode=modes.EVAL, name="eval_loss") == []
        assert rule.seen == [s for s, m in enumerate(phases) if m == modes.EVAL]
        result = status_of(trial, "eval_loss")
        assert result["status"] == "NoIssuesFound"
        assert (result["step"], result["mode"], result["mode_step"]) == \
            (rule.seen[-1], modes.EVAL, len(rule.seen) - 1)


def test_a_rule_that_can_read_nothing_or_fails_after_finding_keeps_the_truth(start_collector):
    collector = start_collector()
    hook = smd.Hook(collector=collector.address, job="truth", strict=True,
                    save_config=smd.SaveConfig(save_interval=1), include_collections=["losses"])
    train(hook, steps=6, lr=0.01)
    hook.close()
    with create_trial(collector.address, "truth") as trial:

        class ReadsAMisspelledTensor(Rule):
            def invoke_at_step(self, step):
                return self.base_trial.tensor("CrossEntropyLoss_outptu_0").value(step) > 0

        assert invoke_rule(ReadsAMisspelledTensor(trial)) == []
        result = status_of(trial, "ReadsAMisspelledTensor")
        assert result["status"] == "Error"
        assert "no step could be evaluated (6 skipped" in result["message"]

        class FindsThenFails(Rule):
            def invoke_at_step(self, step):
                if step == 3:
                    raise RuntimeError("late bug")
                return step == 1

        with pytest.raises(RuntimeError):
            invoke_rule(FindsThenFails(trial))
        result = status_of(trial, "FindsThenFails")
        assert (result["status"], result["step"]) == ("IssuesFound", 1)


def test_rules_written_for_smdebug_construct_and_declare_as_there(start_collector):
    collector = start_collector()
    hook = smd.Hook(collector=collector.address, job="ported", strict=True,
                    save_config=smd.SaveConfig(save_interval=1), include_collections=["losses"])
    train(hook, steps=3, lr=0.01)
    hook.close()

    class Ported(Rule):
        """smdebug's shape: (base_trial, action_str, other_trials), and
        set_required_tensors before each step."""

        def __init__(self, base_trial, action_str="", threshold=0.0):
            super().__init__(base_trial, action_str)
            self.threshold = threshold
            self.declared = []

        def set_required_tensors(self, step):
            self.req_tensors.add("CrossEntropyLoss_output_0", [step])

        def invoke_at_step(self, step):
            self.declared.append(self.req_tensors.get())
            return False

    with create_trial(collector.address, "ported") as trial:
        rule = Ported(trial, "StopTraining")
        assert (rule.action_str, rule.other_trials, rule.trials) == ("StopTraining", [], [trial])
        invoke_rule(rule, post=False)
        assert rule.declared == [[("CrossEntropyLoss_output_0", [s], False)] for s in range(3)]
