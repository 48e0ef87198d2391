"""Sonde for PyTorch, with smdebug's names: `import sonde.torch as smd`."""

from sonde import modes  # noqa: F401
from sonde.config import (  # noqa: F401
    Collection,
    ProfilerConfig,
    ReductionConfig,
    SaveConfig,
    SaveConfigMode,
)
from sonde.torch.hook import Hook, SondeError, StopTrainingRequested, get_hook  # noqa: F401
