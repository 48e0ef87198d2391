"""Exceptions of Sonde's Python client.

The first group carries smdebug's names, constructor arguments and
meanings (smdebug.exceptions), so analysis code written for smdebug catches
the same things:

  TensorUnavailable         the tensor was never saved in this job.
  TensorUnavailableForStep  the step exists but this tensor has no values
                            there, and never will (has_reductions: only its
                            statistics were saved; ask reduction_value).
  StepUnavailable           the step was not saved and never will be.
  StepNotYetAvailable       the step has not been seen yet; training goes on.
  NoMoreData                training has ended without reaching the step.
  InvalidWorker             the tensor exists at the step, not for that worker.

The second group is Sonde's own: the collector could not answer.

  QueryError                a gRPC call failed; `code` (grpc.StatusCode) and
                            `details` are the collector's, unchanged.
  JobNotFound               no job of that name on the collector.
  CollectorUnavailable      the collector cannot be reached (also an OSError
                            ConnectionError).
  TensorDataLoss            values read back fail their CRC-32C or sizes.
"""

from sonde.modes import ModeKeys


def _mode_name(mode):
    try:
        return ModeKeys(mode).name
    except ValueError:
        return str(mode)


class _Described(Exception):
    """Keeps its arguments as the attributes named in _fields and says
    _message formatted with them (and mode_name)."""

    _fields = ()
    _message = ""

    def __init__(self, *args):
        super().__init__(*args)
        for name, value in zip(self._fields, args):
            setattr(self, name, value)

    def __str__(self):
        values = {name: getattr(self, name) for name in self._fields}
        return self._message.format(mode_name=_mode_name(values.get("mode")), **values)


class TensorUnavailable(_Described):
    _fields = ("tname",)
    _message = "tensor '{tname}' was not saved"


class TensorUnavailableForStep(_Described):
    _fields = ("tname", "step", "mode", "has_reductions")
    _message = "tensor '{tname}' has no values at {mode_name} step {step}"

    def __init__(self, tname, step, mode=ModeKeys.GLOBAL, has_reductions=False):
        super().__init__(tname, step, mode, has_reductions)

    def __str__(self):
        if self.has_reductions:
            return super().__str__() + " (only its statistics were saved: ask reduction_value)"
        return super().__str__()


class StepUnavailable(_Described):
    _fields = ("step", "mode")
    _message = "{mode_name} step {step} was not saved"


class StepNotYetAvailable(_Described):
    _fields = ("step", "mode")
    _message = "{mode_name} step {step} is not available yet"


class NoMoreData(_Described):
    _fields = ("step", "mode", "last_step")
    _message = ("training ended before {mode_name} step {step}; "
                "the last {mode_name} step saved is {last_step}")


class RuleEvaluationConditionMet(_Described):
    """A custom rule's invoke_at_step returned True (sonde.rules)."""

    _fields = ("rule_name", "step", "end_of_rule")
    _message = "evaluation of rule {rule_name} at step {step} found its condition met"

    def __init__(self, rule_name, step, end_of_rule=False):
        super().__init__(rule_name, step, end_of_rule)


class InvalidWorker(_Described):
    _fields = ("worker",)
    _message = "invalid worker: {worker}"


class QueryError(Exception):
    """A call to the collector failed with a gRPC status."""

    def __init__(self, message, code=None, details=""):
        super().__init__(message)
        self.code = code
        self.details = details


class JobNotFound(QueryError, LookupError):
    def __init__(self, job, address, details=""):
        super().__init__("no job '{}' on the Sonde collector at {} ({})".format(
            job, address, details), code=_grpc_code("NOT_FOUND"), details=details)
        self.job = job
        self.address = address


class CollectorUnavailable(QueryError, ConnectionError):
    def __init__(self, address, details=""):
        super().__init__("cannot reach the Sonde collector at {}: {}".format(address, details),
                         code=_grpc_code("UNAVAILABLE"), details=details)
        self.address = address


class TensorDataLoss(QueryError):
    def __init__(self, message):
        super().__init__(message, code=_grpc_code("DATA_LOSS"), details=message)


def _grpc_code(name):
    # grpc is imported lazily so that `sonde.exceptions` stays importable
    # (and catchable) without it.
    try:
        import grpc
    except ImportError:
        return None
    return getattr(grpc.StatusCode, name)
