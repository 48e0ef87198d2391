"""sonde.trials: smdebug's analysis API over a Sonde collector.

  from sonde.trials import create_trial
  from sonde import modes

  trial = create_trial("127.0.0.1:7070", "resnet-lr0.1")
  trial.steps(mode=modes.TRAIN)
  trial.tensor("fc1.weight").value(10, mode=modes.TRAIN)   # numpy array
  trial.wait_for_steps([200])                             # blocks, live
  trial.rule_job_summary()
  trial.system_metrics(names="cpu.util_percent")          # profiler data
  trial.framework_events(kind="step")

docs/python.md, section "Analysis (sonde.trials)", lists what differs from
smdebug and why.
"""

from sonde.exceptions import (  # noqa: F401
    CollectorUnavailable,
    InvalidWorker,
    JobNotFound,
    NoMoreData,
    QueryError,
    StepNotYetAvailable,
    StepUnavailable,
    TensorDataLoss,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from sonde.trials.profiler import FrameworkEvent, MetricSeries  # noqa: F401
from sonde.trials.steps import StepState  # noqa: F401
from sonde.trials.tensor import Tensor, TensorStep  # noqa: F401
from sonde.trials.trial import Collection, Trial, create_trial  # noqa: F401

__all__ = [
    "create_trial", "Trial", "Tensor", "TensorStep", "Collection", "StepState", "MetricSeries",
    "FrameworkEvent",
    "CollectorUnavailable", "InvalidWorker", "JobNotFound", "NoMoreData", "QueryError",
    "StepNotYetAvailable", "StepUnavailable", "TensorDataLoss", "TensorUnavailable",
    "TensorUnavailableForStep",
]
