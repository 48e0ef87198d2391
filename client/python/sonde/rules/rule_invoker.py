"""invoke_rule: runs a custom rule over a job's steps as they arrive
(smdebug.rules.rule_invoker.invoke_rule, with Sonde's reporting)."""

import logging

from sonde.exceptions import (
    NoMoreData,
    RuleEvaluationConditionMet,
    StepNotYetAvailable,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from sonde.modes import ModeKeys
from sonde.trials.steps import as_mode
from sonde.v1 import query_pb2, rule_pb2

log = logging.getLogger("sonde.rules")

_ACTIONS = ("StopTraining", "Log")
# What a rule raises when a step lacks what it reads: that step is skipped.
_SKIP = (TensorUnavailableForStep, TensorUnavailable, StepUnavailable, StepNotYetAvailable)


def invoke_rule(rule_obj, start_step=0, end_step=None, raise_eval_cond=False, *,
                mode=ModeKeys.GLOBAL, actions=(), post=True, name=None, suggestion=""):
    """Evaluates `rule_obj` at every saved global step from start_step up to
    end_step (exclusive; None: until training ends), waiting for steps
    that are not committed yet; with `mode`, only at the steps of that mode
    (the rule is still handed global steps, as in smdebug).

    A step at which the rule's tensors were not saved is skipped, as in
    smdebug. When the condition is met: with raise_eval_cond, the
    RuleEvaluationConditionMet is raised; otherwise it is logged and
    evaluation goes on (it stops if the exception says end_of_rule).

    Sonde's additions: with post (the default), the rule's status goes to
    the collector under `name` (default: the rule's class name):
    InProgress when it starts, IssuesFound at the first step whose
    condition is met (then `actions`, "StopTraining" and/or "Log", fire
    once), NoIssuesFound when it ran out of steps without it (Error if it
    could evaluate no step at all), Error or Stopped when the rule's code
    raises or is interrupted before any issue was found. Returns the steps
    at which the condition was met.
    """
    for a in actions:
        if a not in _ACTIONS:
            raise ValueError("actions may be StopTraining or Log, not %r" % (a,))
    mode = as_mode(mode)
    trial = rule_obj.base_trial
    name = name or rule_obj.rule_name
    reporter = _Reporter(trial, name, type(rule_obj).__name__, list(actions),
                         suggestion) if post else None
    if reporter:
        reporter.post(rule_pb2.RULE_STATUS_IN_PROGRESS, -1, "evaluating")
    state = _State(0 if start_step is None else int(start_step))
    log.info("started rule %s at step %d", name, state.next)

    def evaluate(step):
        """Whether evaluation should stop after the step."""
        state.current = step
        try:
            rule_obj.invoke(step)
        except _SKIP as e:
            state.skipped += 1
            state.skip_reason = str(e)
            log.debug("rule %s skips step %d: %s", name, step, e)
            return False
        except RuleEvaluationConditionMet as e:
            state.evaluated += 1
            state.met.append(step)
            if reporter and len(state.met) == 1:
                reporter.post(rule_pb2.RULE_STATUS_ISSUES_FOUND, step, str(e))
            if raise_eval_cond:
                raise
            log.info("%s", e)
            return bool(e.end_of_rule)
        state.evaluated += 1
        return False

    try:
        _run(trial, mode, state, end_step, evaluate)
    except RuleEvaluationConditionMet:
        raise  # raise_eval_cond: IssuesFound is posted already
    except BaseException as e:
        # The rule's own code failed, the collector did, or the user
        # interrupted it. An IssuesFound already posted stays the verdict;
        # otherwise say so where the rule's status is read.
        if reporter and not state.met:
            status = rule_pb2.RULE_STATUS_STOPPED if isinstance(e, KeyboardInterrupt) \
                else rule_pb2.RULE_STATUS_ERROR
            try:
                reporter.post(status, state.current, "%s: %s" % (type(e).__name__, e))
            except Exception:  # noqa: BLE001 - the first error is the one to raise
                pass
        raise
    if reporter and not state.met:
        if state.evaluated == 0 and state.skipped > 0:
            reporter.post(rule_pb2.RULE_STATUS_ERROR, state.current,
                          "no step could be evaluated (%d skipped; last: %s)"
                          % (state.skipped, state.skip_reason))
        else:
            reporter.post(rule_pb2.RULE_STATUS_NO_ISSUES_FOUND, state.current,
                          "condition not met at %d steps evaluated (%d skipped: what the rule "
                          "reads was not saved)" % (state.evaluated, state.skipped))
    return state.met


class _State:
    def __init__(self, start):
        self.next = start      # the first global step not looked at yet
        self.current = -1      # the step being (or last) evaluated
        self.met = []
        self.evaluated = 0
        self.skipped = 0
        self.skip_reason = ""


def _run(trial, mode, state, end_step, evaluate):
    """Evaluates every saved step of `mode` from state.next on."""
    def wanted(info):
        return mode == ModeKeys.GLOBAL or info.mode == int(mode)

    while end_step is None or state.next < end_step:
        # Steps already committed: one look at the job, then each in order.
        progress, steps = trial._snapshot(ModeKeys.GLOBAL)
        ready = [k for k in steps.keys
                 if k >= state.next and (end_step is None or k < end_step)
                 and progress.final(k)]
        if ready:
            for k in ready:
                state.next = k + 1
                if wanted(steps.by_key[k]) and evaluate(k):
                    return
            continue
        try:
            trial.wait_for_steps([state.next])
        except StepUnavailable:
            state.next += 1  # not saved; a later step is committed
            continue
        except NoMoreData:
            return
        # Delivered, though a worker may never commit it (the collector
        # judged it after --step_wait): evaluate it as the rules do.
        step = state.next
        state.next += 1
        info = trial._steps(ModeKeys.GLOBAL).by_key.get(step)
        if info is not None and wanted(info) and evaluate(step):
            return


class _Reporter:
    def __init__(self, trial, name, rule_type, actions, suggestion):
        self.trial = trial
        self.name = name
        self.rule_type = "%s (custom)" % rule_type
        self.actions = actions
        self.suggestion = suggestion

    def post(self, status, step, message):
        """Posts the rule's status at a global step (-1: none)."""
        result = rule_pb2.RuleResult(job=self.trial.job, rule=self.name,
                                     rule_type=self.rule_type, status=status, step=step,
                                     message=message, suggestion=self.suggestion)
        if step >= 0:
            info = self.trial._steps(ModeKeys.GLOBAL).by_key.get(step)
            if info is not None:
                result.mode = info.mode
                result.mode_step = info.mode_step
        self.trial._conn.call(
            "PostRuleResult",
            query_pb2.PostRuleResultRequest(result=result, actions=self.actions),
            job=self.trial.job)
