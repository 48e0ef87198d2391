"""Custom rules in Python, as smdebug writes them.

  from sonde.rules import Rule, invoke_rule
  from sonde.trials import create_trial

  class GradientTooLarge(Rule):
      def __init__(self, base_trial, threshold=10.0):
          super().__init__(base_trial)
          self.threshold = float(threshold)

      def invoke_at_step(self, step):
          for name in self.base_trial.tensor_names(collection="gradients"):
              if self.base_trial.tensor(name).reduction_value(step, "mean", abs=True) \\
                      > self.threshold:
                  return True
          return False

  trial = create_trial("127.0.0.1:7070", "my-job")
  invoke_rule(GradientTooLarge(trial, threshold=5), actions=["StopTraining"])

invoke_rule follows the job live (it waits for each step the collector
commits) until training ends or end_step, and posts the rule's status to
the collector (PostRuleResult), where it appears beside the built-in rules
(`sonde rules --job J`); the first time the condition is met it is
IssuesFound there, and the actions given (StopTraining, Log) fire once.
"""

from sonde.exceptions import RuleEvaluationConditionMet  # noqa: F401
from sonde.rules.rule import Rule  # noqa: F401
from sonde.rules.rule_invoker import invoke_rule  # noqa: F401

__all__ = ["Rule", "invoke_rule", "RuleEvaluationConditionMet"]
