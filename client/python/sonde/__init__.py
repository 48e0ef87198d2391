"""Sonde: a real-time debugger for machine-learning training.

  import sonde.torch as smd            # the PyTorch hook (smdebug's API)
  from sonde.trials import create_trial
  from sonde import modes
"""

from sonde import modes  # noqa: F401
from sonde.modes import ModeKeys  # noqa: F401
