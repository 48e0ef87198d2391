"""Rule: the base class of a custom rule (smdebug.rules.rule.Rule)."""

import logging

from sonde.exceptions import RuleEvaluationConditionMet


class Rule:
    """Subclass it and define invoke_at_step(step) -> bool (True: the
    condition the rule looks for is met at that step).

    base_trial: the Trial the rule reads (sonde.trials.create_trial).
    other_trials: further trials it compares with (smdebug's argument).
    """

    def __init__(self, base_trial, other_trials=None, action_str=""):
        self.base_trial = base_trial
        self.other_trials = list(other_trials or [])
        self.action_str = action_str  # accepted for smdebug; see invoke_rule(actions=)
        self.rule_name = type(self).__name__
        self.logger = logging.getLogger("sonde.rules")

    def invoke_at_step(self, step):
        raise NotImplementedError("a Rule subclass defines invoke_at_step(step)")

    def invoke(self, step):
        """Evaluates the rule at a step: RuleEvaluationConditionMet when its
        condition is met. A step or tensor the rule reads that was not saved
        (StepUnavailable, TensorUnavailableForStep) passes up to
        invoke_rule, which goes on to the next step."""
        if self.invoke_at_step(step):
            raise RuleEvaluationConditionMet(self.rule_name, step)
