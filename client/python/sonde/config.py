"""What to save and when, with smdebug's classes and defaults.

  SaveConfig(save_interval=500, start_step=0, end_step=None, save_steps=None,
             mode_save_configs={modes.EVAL: SaveConfigMode(save_interval=1)})
  ReductionConfig(reductions=[], abs_reductions=[], norms=[], abs_norms=[],
                  save_raw_tensor=False)   (e.g. reductions=["mean"], norms=["l2"])
  Collection(name, include_regex=[...], save_config=..., reduction_config=...,
             save_histogram=False)

A step is saved when it is in save_steps, or when start_step <= step <
end_step and step % save_interval == 0 (steps count per mode). Each
class turns itself into the JSON the C++ hook reads
(client/python/options_json.h); the C++ side checks every value.
"""

from sonde import modes as _modes

DEFAULT_SAVE_INTERVAL = 500

# smdebug's, less "prod": a product is no statistic the collector keeps (it
# over- or underflows for all but small tensors). Trials compute it from
# saved values (save_raw_tensor=True).
_REDUCTIONS = ("min", "max", "mean", "std", "variance", "sum")
_NORMS = ("l1", "l2")


class SaveConfigMode:
    """When to save in one mode; unset fields take the SaveConfig's values."""

    def __init__(self, save_interval=None, start_step=None, end_step=None, save_steps=None):
        self.save_interval = save_interval
        self.start_step = start_step
        self.end_step = end_step
        self.save_steps = list(save_steps) if save_steps is not None else None

    def _json(self, base=None):
        base = base or SaveConfigMode(DEFAULT_SAVE_INTERVAL, 0, None, [])
        pick = lambda mine, theirs: theirs if mine is None else mine  # noqa: E731
        interval = pick(self.save_interval, base.save_interval)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval <= 0:
            raise ValueError("save_interval must be a positive integer, not %r" % (interval,))
        return {
            "save_interval": interval,
            "start_step": int(pick(self.start_step, base.start_step) or 0),
            "end_step": pick(self.end_step, base.end_step),
            "save_steps": [int(s) for s in (pick(self.save_steps, base.save_steps) or [])],
        }

    def __repr__(self):
        return "SaveConfigMode(save_interval=%r, start_step=%r, end_step=%r, save_steps=%r)" % (
            self.save_interval, self.start_step, self.end_step, self.save_steps)


class SaveConfig:
    """When to save, for every mode or per mode (smdebug's SaveConfig)."""

    def __init__(self, save_interval=DEFAULT_SAVE_INTERVAL, start_step=0, end_step=None,
                 save_steps=None, mode_save_configs=None):
        self.default = SaveConfigMode(save_interval, start_step, end_step, save_steps or [])
        self.mode_save_configs = {}
        for mode, config in (mode_save_configs or {}).items():
            mode = _modes.ModeKeys(mode)
            if isinstance(config, dict):
                config = SaveConfigMode(**config)
            self.mode_save_configs[mode] = config

    def get_save_config(self, mode):
        return self.mode_save_configs.get(_modes.ModeKeys(mode), self.default)

    def _json(self):
        base = self.default
        base_json = base._json()
        return {
            str(int(mode)): (self.mode_save_configs[mode]._json(base)
                             if mode in self.mode_save_configs else base_json)
            for mode in _modes.ModeKeys
        }

    def __repr__(self):
        return "SaveConfig(default=%r, mode_save_configs=%r)" % (self.default,
                                                                 self.mode_save_configs)


class ReductionConfig:
    """Statistics to save instead of (or with) the values; smdebug's names.
    save_shape is accepted for smdebug compatibility and ignored (shapes
    are always stored)."""

    def __init__(self, reductions=None, abs_reductions=None, norms=None, abs_norms=None,
                 save_raw_tensor=False, save_shape=False):
        self.reductions = list(reductions or [])
        self.abs_reductions = list(abs_reductions or [])
        self.norms = list(norms or [])
        self.abs_norms = list(abs_norms or [])
        self.save_raw_tensor = bool(save_raw_tensor)
        # Accepted for smdebug compatibility and ignored: shapes are always stored.
        self.save_shape = bool(save_shape)
        for r in self.reductions + self.abs_reductions:
            if r == "prod":
                raise ValueError("reduction 'prod' is not saved as a statistic; save values "
                                 "(save_raw_tensor=True) and ask a trial for "
                                 "reduction_value(step, 'prod')")
            if r not in _REDUCTIONS:
                raise ValueError("reduction %r is not one of %s" % (r, ", ".join(_REDUCTIONS)))
        for n in self.norms + self.abs_norms:
            if n not in _NORMS:
                raise ValueError("norm %r is not one of %s" % (n, ", ".join(_NORMS)))

    def _json(self):
        return {
            "reductions": self.reductions,
            "abs_reductions": self.abs_reductions,
            "norms": self.norms,
            "abs_norms": self.abs_norms,
            "save_raw_tensor": self.save_raw_tensor,
        }


class Collection:
    """A named group of tensors with its own save settings (smdebug's Collection).

    Tensors join by regex (include), by name (add_tensor_name), or as a
    module's inputs and outputs (add_module_tensors).
    """

    def __init__(self, name, include_regex=None, save_config=None, reduction_config=None,
                 save_histogram=False):
        self.name = name
        self.include_regex = list(include_regex or [])
        self.save_config = save_config
        self.reduction_config = reduction_config
        self.save_histogram = save_histogram
        self.tensor_names = set()
        self.modules = []  # (module, inputs, outputs)

    def include(self, regex):
        if isinstance(regex, str):
            regex = [regex]
        self.include_regex.extend(regex)

    def add_tensor_name(self, name):
        self.tensor_names.add(name)

    def add_module_tensors(self, module, inputs=False, outputs=True):
        self.modules.append((module, bool(inputs), bool(outputs)))

    def _customized(self):
        return bool(self.include_regex or self.save_config is not None or
                    self.reduction_config is not None or self.save_histogram)

    def _json(self):
        save_config = self.save_config
        if isinstance(save_config, dict):
            save_config = SaveConfig(mode_save_configs=save_config)
        return {
            "name": self.name,
            "include_regex": self.include_regex,
            "save_config": save_config._json() if save_config is not None else None,
            "reduction_config": (self.reduction_config._json()
                                 if self.reduction_config is not None else None),
            "save_histogram": bool(self.save_histogram),
        }

    def __repr__(self):
        return "Collection(%r, include_regex=%r)" % (self.name, self.include_regex)


class ProfilerConfig:
    """The profiler (SageMaker's ProfilerConfig): system metrics every
    `system_monitor_interval_millis` (100..60000, default 500) and framework
    timings (steps, data-loader waits, forward/backward, spans).
    nvml_library: where to dlopen NVML from (default libnvidia-ml.so.1,
    found by the dynamic loader); without it the profiler reports no GPU."""

    def __init__(self, system_monitor_interval_millis=500, system=True, framework=True,
                 nvml_library=None):
        millis = int(system_monitor_interval_millis)
        if not 100 <= millis <= 60000:
            raise ValueError("system_monitor_interval_millis must be in 100..60000, not %r"
                             % (system_monitor_interval_millis,))
        self.system_monitor_interval_millis = millis
        self.system = bool(system)
        self.framework = bool(framework)
        if nvml_library is not None and (not isinstance(nvml_library, str) or not nvml_library):
            raise ValueError("nvml_library must be a non-empty path, not %r" % (nvml_library,))
        self.nvml_library = nvml_library

    def _json(self):
        out = {"enabled": True, "interval_seconds": self.system_monitor_interval_millis / 1000.0,
               "system": self.system, "framework": self.framework}
        if self.nvml_library is not None:
            out["nvml_library"] = self.nvml_library
        return out
