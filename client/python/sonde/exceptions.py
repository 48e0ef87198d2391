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


class TensorUnavailable(Exception):
    def __init__(self, tname):
        super().__init__(tname)
        self.tname = tname

    def __str__(self):
        return "tensor '{}' was not saved".format(self.tname)


class TensorUnavailableForStep(Exception):
    def __init__(self, tname, step, mode=ModeKeys.GLOBAL, has_reductions=False):
        super().__init__(tname, step, mode, has_reductions)
        self.tname = tname
        self.step = step
        self.mode = mode
        self.has_reductions = has_reductions

    def __str__(self):
        msg = "tensor '{}' has no values at {} step {}".format(
            self.tname, _mode_name(self.mode), self.step)
        if self.has_reductions:
            msg += " (only its statistics were saved: ask reduction_value)"
        return msg


class StepUnavailable(Exception):
    def __init__(self, step, mode):
        super().__init__(step, mode)
        self.step = step
        self.mode = mode

    def __str__(self):
        return "{} step {} was not saved".format(_mode_name(self.mode), self.step)


class StepNotYetAvailable(Exception):
    def __init__(self, step, mode):
        super().__init__(step, mode)
        self.step = step
        self.mode = mode

    def __str__(self):
        return "{} step {} is not available yet".format(_mode_name(self.mode), self.step)


class NoMoreData(Exception):
    def __init__(self, step, mode, last_step):
        super().__init__(step, mode, last_step)
        self.step = step
        self.mode = mode
        self.last_step = last_step

    def __str__(self):
        return "training ended before {} step {}; the last {} step saved is {}".format(
            _mode_name(self.mode), self.step, _mode_name(self.mode), self.last_step)


class InvalidWorker(Exception):
    def __init__(self, worker):
        super().__init__(worker)
        self.worker = worker

    def __str__(self):
        return "invalid worker: {}".format(self.worker)


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
