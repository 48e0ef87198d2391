"""Sonde: a real-time debugger for machine-learning training.

  import sonde.torch as smd            # the PyTorch hook (smdebug's API)
  from sonde.trials import create_trial
  from sonde import modes
"""

# The package's sources and its built parts (_sonde.so, the sonde.v1 stubs)
# may sit in two directories on sys.path (client/python and
# bazel-bin/client/python); this makes them one package.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

from sonde import modes  # noqa: F401,E402
from sonde.modes import ModeKeys  # noqa: F401,E402
