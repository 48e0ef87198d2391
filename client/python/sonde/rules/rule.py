"""Rule: the base class of a custom rule (smdebug.rules.rule.Rule)."""

import logging

from sonde.exceptions import RuleEvaluationConditionMet


class RequiredTensors:
    """smdebug's declaration of the tensors a rule reads at a step, which
    smdebug prefetches. Sonde reads on demand, so this only keeps what was
    declared (`get()`), for rules ported with their set_required_tensors."""

    def __init__(self):
        self._required = []

    def add(self, name, steps, should_match_regex=False):
        self._required.append((name, list(steps), bool(should_match_regex)))

    def get(self):
        return list(self._required)

    def clear(self):
        self._required = []


class Rule:
    """Subclass it and define invoke_at_step(step) -> bool (True: the
    condition the rule looks for is met at that global step).

    The constructor takes smdebug's arguments in smdebug's order:
    base_trial, the Trial the rule reads (sonde.trials.create_trial);
    action_str, kept for ported rules (Sonde's actions are invoke_rule's
    `actions=`); other_trials, further trials it compares with.
    """

    def __init__(self, base_trial, action_str="", other_trials=None):
        self.base_trial = base_trial
        self.action_str = action_str
        self.other_trials = list(other_trials or [])
        self.trials = [base_trial] + self.other_trials
        self.rule_name = type(self).__name__
        self.req_tensors = RequiredTensors()
        self.logger = logging.getLogger("sonde.rules")

    def set_required_tensors(self, step):
        """Called before invoke_at_step, as in smdebug (nothing to do by
        default: tensors are read when asked for)."""

    def invoke_at_step(self, step):
        raise NotImplementedError("a Rule subclass defines invoke_at_step(step)")

    def invoke(self, step):
        """Evaluates the rule at a step: RuleEvaluationConditionMet when its
        condition is met. A step or tensor the rule reads that was not saved
        (StepUnavailable, TensorUnavailableForStep) passes up to
        invoke_rule, which goes on to the next step."""
        self.req_tensors.clear()
        self.set_required_tensors(step)
        if self.invoke_at_step(step):
            raise RuleEvaluationConditionMet(self.rule_name, step)
