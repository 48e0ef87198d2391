"""Sonde: a real-time debugger for machine-learning training.

  import sonde.torch as smd            # the PyTorch hook (smdebug's API)
  from sonde.trials import create_trial
  from sonde import modes
"""

# The package's sources and its built parts (_sonde.so, the sonde.v1 stubs)
# may sit in two directories on sys.path (client/python and
# bazel-bin/client/python); this makes them one package.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

import os as _os  # noqa: E402

# The extension carries the C++ protobuf code of sonde.v1. With protobuf's
# C++ Python backend (Debian's python3-protobuf), which shares the C++
# descriptor pool with it, a sonde.v1 module imported before the extension
# and one imported after it disagree on their messages' descriptors
# ("TypeError: No message class registered for 'sonde.v1.RuleSpec'"; pip's
# upb backend keeps a pool of its own and is not affected). Loading it
# first, before anything can import sonde.v1, keeps them one.
# SONDE_NO_EXTENSION=1 leaves it out, for processes that use only the
# sonde.v1 stubs and grpc (an external rule worker) and need no native code.
if _os.environ.get("SONDE_NO_EXTENSION") != "1":
    try:
        from sonde import _sonde  # noqa: F401,E402
    except ImportError:  # a source tree whose extension is not built
        pass

from sonde import modes  # noqa: F401,E402
from sonde.modes import ModeKeys  # noqa: F401,E402


def _version():
    """The installed distribution's version, else the repository's VERSION
    file (the one place the version is written)."""
    try:
        from importlib.metadata import version
        return version("sonde")
    except Exception:  # noqa: BLE001 - not installed: a source tree
        pass
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "VERSION")
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "0+unknown"


__version__ = _version()
