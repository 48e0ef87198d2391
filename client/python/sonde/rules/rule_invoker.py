"""invoke_rule: runs a custom rule over a job's steps as they arrive
(smdebug.rules.rule_invoker.invoke_rule, with Sonde's reporting)."""

import logging

from sonde.exceptions import (
    NoMoreData,
    RuleEvaluationConditionMet,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from sonde.modes import ModeKeys
from sonde.trials.steps import as_mode
from sonde.v1 import query_pb2, rule_pb2

log = logging.getLogger("sonde.rules")

_ACTIONS = ("StopTraining", "Log")


def invoke_rule(rule_obj, start_step=0, end_step=None, raise_eval_cond=False, *,
                mode=ModeKeys.GLOBAL, actions=(), post=True, name=None, suggestion=""):
    """Evaluates `rule_obj` at every saved step from start_step up to
    end_step (exclusive; None: until training ends), waiting for steps
    that are not committed yet. Steps are global steps, or mode steps of
    `mode`.

    Steps at which the rule's tensors were not saved are skipped, as in
    smdebug. When the condition is met: with raise_eval_cond, the
    RuleEvaluationConditionMet is raised; otherwise it is logged and
    evaluation goes on (it stops if the exception says end_of_rule).

    Sonde's additions: with post (the default), the rule's status goes to
    the collector under `name` (default: the rule's class name):
    InProgress when it starts, IssuesFound at the first step whose
    condition is met (then `actions`, "StopTraining" and/or "Log", fire
    once), NoIssuesFound when training ended without it. Returns the steps
    at which the condition was met.
    """
    for a in actions:
        if a not in _ACTIONS:
            raise ValueError("actions may be StopTraining or Log, not %r" % (a,))
    mode = as_mode(mode)
    trial = rule_obj.base_trial
    name = name or rule_obj.rule_name
    reporter = _Reporter(trial, name, type(rule_obj).__name__, mode, list(actions),
                         suggestion) if post else None
    if reporter:
        reporter.post(rule_pb2.RULE_STATUS_IN_PROGRESS, -1, "evaluating")
    met = []
    step = 0 if start_step is None else int(start_step)
    at = [step]  # the step being evaluated, for an error's report
    log.info("started rule %s at step %d", name, step)

    def evaluate(s):
        """Whether evaluation should stop after step s."""
        at[0] = s
        try:
            rule_obj.invoke(s)
        except (TensorUnavailableForStep, StepUnavailable, TensorUnavailable) as e:
            log.debug("rule %s at step %d: %s", name, s, e)
        except RuleEvaluationConditionMet as e:
            met.append(s)
            if reporter and len(met) == 1:
                reporter.post(rule_pb2.RULE_STATUS_ISSUES_FOUND, s, str(e))
            if raise_eval_cond:
                raise
            log.info("%s", e)
            return bool(e.end_of_rule)
        return False

    try:
        step = _run(trial, mode, step, end_step, evaluate)
    except RuleEvaluationConditionMet:
        raise  # raise_eval_cond: IssuesFound is posted already
    except BaseException as e:
        # The rule's own code failed, or the collector did, or the user
        # interrupted it: say so where its status is read, then let the
        # caller see it.
        if reporter:
            status = rule_pb2.RULE_STATUS_STOPPED if isinstance(e, KeyboardInterrupt) \
                else rule_pb2.RULE_STATUS_ERROR
            try:
                reporter.post(status, at[0], "%s: %s" % (type(e).__name__, e))
            except Exception:  # noqa: BLE001 - the first error is the one to raise
                pass
        raise
    if reporter and not met:
        reporter.post(rule_pb2.RULE_STATUS_NO_ISSUES_FOUND, step - 1,
                      "condition not met at any step up to %d" % (step - 1))
    return met


def _run(trial, mode, step, end_step, evaluate):
    """Evaluates every saved step from `step` on; the step after the last."""
    stop = False
    while not stop and (end_step is None or step < end_step):
        # Steps already committed: one look, then each in order.
        ready = [s for s in trial.steps(mode=mode)
                 if s >= step and (end_step is None or s < end_step)]
        if ready:
            for s in ready:
                step = s + 1
                stop = evaluate(s)
                if stop:
                    break
            continue
        try:
            trial.wait_for_steps([step], mode=mode)
        except StepUnavailable:
            step += 1  # not saved; later steps are committed
            continue
        except NoMoreData:
            break
        step += 1
        stop = evaluate(step - 1)
    return step


class _Reporter:
    def __init__(self, trial, name, rule_type, mode, actions, suggestion):
        self.trial = trial
        self.name = name
        self.rule_type = "%s (custom)" % rule_type
        self.mode = mode
        self.actions = actions
        self.suggestion = suggestion

    def post(self, status, step, message):
        result = rule_pb2.RuleResult(job=self.trial.job, rule=self.name,
                                     rule_type=self.rule_type, status=status, step=step,
                                     message=message, suggestion=self.suggestion)
        if self.mode != ModeKeys.GLOBAL and step >= 0:
            result.mode = int(self.mode)
            result.mode_step = step
            global_step = self.trial.global_step(self.mode, step)
            result.step = step if global_step is None else global_step
        self.trial._conn.call(
            "PostRuleResult",
            query_pb2.PostRuleResultRequest(result=result, actions=self.actions),
            job=self.trial.job)
