"""sonde.torch.Hook: smdebug's PyTorch hook, streaming to a Sonde collector.

  import sonde.torch as smd
  hook = smd.Hook(collector="collector:7070", job="resnet-lr0.1",
                  save_config=smd.SaveConfig(save_interval=100),
                  include_collections=["weights", "gradients", "losses"])
  hook.register_module(model)
  hook.register_loss(criterion)
  for x, y in loader:
      loss = criterion(model(x), y)   # the model's forward starts a step
      loss.backward()
      optimizer.step()
      if hook.should_stop():          # a rule's StopTraining reached us
          break
  hook.close()

Tensor names are smdebug's: `<Model>_<param>` for weights and biases
(saved when the model's forward begins), `gradient/<Model>_<param>` (in
backward, only for parameters that require grad), `<module>_input_<i>` and
`<module>_output_<i>` for modules (the top module is named by its class),
and `<Loss>_output_0` for registered losses.

All the work is in the C++ hook (sonde._sonde): statistics, histograms,
chunking and streaming run on its threads without the GIL. This file only
turns tensors into (pointer, dtype, shape, device, stream). CPU tensors are
copied before the call returns; CUDA tensors are measured on their device,
ordered after the current stream, with no synchronisation, .cpu() or .item()
on the training thread.

A failure inside Sonde never stops training: it is logged once and the hook
disables itself (strict=True raises instead). Saves the collector refuses
(a bad name, a full device buffer pool) are logged once and training goes on.
"""

import atexit
import contextlib
import ctypes
import functools
import importlib
import json
import logging
import os
import time
import weakref

import numpy as np
import torch

from sonde import _sonde
from sonde import modes as _modes
from sonde.config import Collection, ProfilerConfig, ReductionConfig, SaveConfig
from sonde.torch import _compile
from sonde.v1 import profile_pb2, tensor_pb2

_KIND = profile_pb2.TraceEvent  # KIND_DATA_WAIT, KIND_FORWARD, ...

log = logging.getLogger("sonde")

# torch dtypes Sonde saves as they are, to their sonde.v1.DType (the wire's
# enum, proto/tensor.proto).
_DTYPES = {
    torch.float32: tensor_pb2.DTYPE_F32,
    torch.float16: tensor_pb2.DTYPE_F16,
    torch.bfloat16: tensor_pb2.DTYPE_BF16,
    torch.float64: tensor_pb2.DTYPE_F64,
    torch.int8: tensor_pb2.DTYPE_I8,
    torch.int16: tensor_pb2.DTYPE_I16,
    torch.int32: tensor_pb2.DTYPE_I32,
    torch.int64: tensor_pb2.DTYPE_I64,
    torch.uint8: tensor_pb2.DTYPE_U8,
    torch.bool: tensor_pb2.DTYPE_BOOL,
}
_CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# numpy dtypes that torch.from_numpy takes and Sonde saves as they are;
# others (uint16/32/64, complex, ...) are saved as float64.
_NUMPY_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float16, np.float64, np.int8,
                                                  np.int16, np.int32, np.int64, np.uint8,
                                                  np.bool_))

_BUILTIN_COLLECTIONS = ("weights", "biases", "gradients", "losses", "inputs", "outputs",
                        "scalars", "metrics", "default", "all")

# What Hook() takes that a hook config file replaces.
_FILE_CONFIG_KWARGS = ("save_config", "reduction_config", "include_regex", "include_collections",
                       "save_all")

CONFIG_FILE_ENV = ("SONDE_CONFIG_FILE_PATH", "SMDEBUG_CONFIG_FILE_PATH")
DEFAULT_CONFIG_FILE = "/opt/ml/input/config/debughookconfig.json"


class SondeError(RuntimeError):
    """A Sonde failure, raised only by hooks created with strict=True."""


class StopTrainingRequested(Exception):
    """Raised at the next step boundary after a rule's StopTraining action,
    by hooks created with raise_on_stop=True. `action` has the rule, reason
    and step."""

    def __init__(self, action):
        self.action = action or {}
        super().__init__("rule %s asked to stop training at step %s: %s" % (
            self.action.get("rule", "?"), self.action.get("step", "?"),
            self.action.get("reason", "")))


def _flatten(value):
    """The tensors of a module's inputs or outputs, in order (nested tuples,
    lists and dicts flattened as smdebug numbers them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        out = []
        for v in value:
            out.extend(_flatten(v))
        return out
    if isinstance(value, dict):
        out = []
        for k in value:
            out.extend(_flatten(value[k]))
        return out
    return []


def _from_numpy(value):
    """A numpy array or Python number as a CPU tensor sharing its memory
    where it can."""
    array = np.asarray(value)
    if array.dtype not in _NUMPY_DTYPES:
        array = array.astype(np.float64)
    if not array.flags.c_contiguous or not array.flags.writeable:
        # (np.ascontiguousarray would make a 0-d array 1-d; torch.from_numpy
        # takes no negative strides and warns about read-only arrays.)
        array = array.copy(order="C")
    return torch.from_numpy(array)


def _timed(method):
    """Adds the method's time to the hook's _hook_seconds: where a step's
    time goes, for benchmarks (counters()["hook_seconds"]). Only on methods
    that always run eagerly, never traced by dynamo."""
    @functools.wraps(method)
    def timed(self, *args):
        start = time.perf_counter()
        try:
            return method(self, *args)
        finally:
            self._hook_seconds += time.perf_counter() - start
    return timed


class Hook:
    """smdebug's PyTorch Hook API; `collector` and `job` replace out_dir.

    Args (all optional except job, which a config file may supply):
      collector: host:port of the collector (default 127.0.0.1:7070, or
        $SONDE_COLLECTOR).
      job: the job's name, [A-Za-z0-9._-]{1,128} (default $SONDE_JOB).
      save_config: a SaveConfig (default: every 500 steps).
      reduction_config: a ReductionConfig: save these statistics instead of
        the values (default: save values).
      include_regex: tensor-name regexes of the "default" collection.
      include_collections: collections to save (default ["losses"]; rules
        add what they need when the collector accepts the job).
      save_all: save every tensor.
      include_workers: "one" (only rank 0 saves) or "all".
      export_tensorboard: ask the collector to write TensorBoard files.
      rules: extra rules for this job in the collector's --rules syntax,
        e.g. "ExplodingTensor(actions=StopTraining);VanishingGradient".
      metadata: free-form strings stored with the job.
      token, ca_file, cert_file, key_file, server_name_override: bearer token
        and TLS for a collector that asks for them.
      worker, world_size: this process's rank and the number of processes
        (default: torch.distributed's, else 0 and 1).
      strict: raise SondeError on any Sonde failure instead of logging once
        and disabling (for tests and CI).
      raise_on_stop: raise StopTrainingRequested at the next step boundary
        once a rule asks to stop, once: later forwards (an EVAL pass, a
        checkpoint's) run normally (default: only should_stop() turns true).
        With include_workers="one" only rank 0 sees the stop: see
        should_stop().
      max_queue_bytes, backpressure ("spill", "drop", "block"), spill_dir,
      max_spill_bytes, max_block_seconds, close_timeout_seconds: see
        client/hook.h and client/backpressure.h (defaults: 4 GiB of spill
        file, 1 s of waiting under "block" before a save is dropped).
      spool_dir: the durable spool, where each step waits on disk until the
        collector acknowledges it, so that steps not stored when the
        process ends (a collector down, kill -9) can be uploaded later with
        `sonde sync` (default $SONDE_SPOOL_DIR, else
        $XDG_CACHE_HOME/sonde/spool, else ~/.cache/sonde/spool; False: no
        spool). max_spool_bytes: its limit (default 4 GiB).
      defer_device_reads: let the GPU statistics of CUDA weights and
        activations overlap training instead of making the training stream wait
        for them right after each save: it waits at the next save, at the end
        of each backward pass that saves gradients (they are often changed in
        place before the optimizer runs: clip_grad_norm_, GradScaler.unscale_),
        at the next step, and after every torch.optim optimizer's step (so the
        optimizer's writes, zero_grad and the allocator's reuse of freed memory
        come after the reads). Needs torch >= 2.0; a loop that updates
        parameters without a torch.optim optimizer must call fence_device()
        first. Default False.
    """

    def __init__(self, collector=None, job=None, save_config=None, reduction_config=None,
                 include_regex=None, include_collections=None, save_all=False,
                 include_workers="one", export_tensorboard=False, rules=None, metadata=None,
                 token=None, ca_file=None, cert_file=None, key_file=None,
                 server_name_override=None, worker=None, world_size=None, strict=False,
                 raise_on_stop=False, max_queue_bytes=None, backpressure=None, spill_dir=None,
                 max_spill_bytes=None, max_block_seconds=None, close_timeout_seconds=None,
                 profiler=None, spool_dir=None, max_spool_bytes=None, defer_device_reads=False,
                 _config_file=None):
        if include_workers not in ("one", "all"):
            raise ValueError("include_workers must be 'one' or 'all', not %r" % (include_workers,))
        if save_config is not None and not isinstance(save_config, SaveConfig):
            raise TypeError("save_config must be a sonde SaveConfig")
        if reduction_config is not None and not isinstance(reduction_config, ReductionConfig):
            raise TypeError("reduction_config must be a sonde ReductionConfig")
        if worker is None or world_size is None:
            rank, size = 0, 1
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                rank, size = torch.distributed.get_rank(), torch.distributed.get_world_size()
            worker = rank if worker is None else worker
            world_size = size if world_size is None else world_size
        self.strict = bool(strict)
        self.raise_on_stop = bool(raise_on_stop)
        self._stop_raised = False
        self.worker = int(worker)
        self.world_size = int(world_size)
        self.save_config = save_config or SaveConfig()
        self.reduction_config = reduction_config
        self.include_regex = list(include_regex or [])
        self.include_collections = list(include_collections or [])
        self.save_all = bool(save_all)
        self._collections = {}
        self._native = None
        self._disabled = self.worker != 0 and include_workers == "one"
        self._closed = False
        self._pid = os.getpid()  # a forked child (DataLoader worker) must not touch the hook
        _LIVE_HOOKS.add(self)
        self._logged = set()
        self._due = False
        self._mode = _modes.GLOBAL
        self._handles = []          # permanent: the models' pre-hooks, the profiler's hooks
        self._step_handles = []     # this step's forward and gradient hooks
        self._watched = []          # modules whose forward hooks a saving step adds
        self._gradients = []        # (name, param) whose gradient hooks a saving step adds
        # This backward pass's gradients, saved together when it ends: one
        # device statistics batch per step, not one per parameter.
        self._grad_items = []
        self._grad_keep = []
        self._grad_flush_queued = False
        self._module_names = {}     # id(module) -> smdebug name
        self._module_collections = {}  # id(module) -> [(collection, inputs, outputs)]
        self._hooked_modules = []   # what a saving step may hook (see _step_modules)
        self._modules_key = None    # what _hooked_modules was computed from
        self._weights = {}          # id(model) -> [(name, param)], saved at its forward
        self._plan_key = None       # what _plan_value was computed from
        self._plan_value = None     # (modules, gradients?, weights?) of a saving step
        self._hooked_plan = None    # the plan the step hooks in place follow
        self._ran = set()           # ids of modules whose forward hook ran this step
        self._calls = {}            # id(module) -> its forward hook's calls this step
        # With defer_device_reads: CUDA copies made only to be read (dense,
        # contiguous), kept until the next fence orders training after the
        # reads; freed sooner, the caching allocator could hand their memory
        # to training's next kernels before the statistics have read it.
        self._unfenced_copies = []
        self._modules_missed = 0    # due in a saving step, hook never ran
        self._began_step = False    # a registered model's forward began a step
        self._arity = {}            # id(module) -> (inputs, outputs), once seen
        self._tops = set()          # ids of registered top-level modules
        self._losses = []           # registered loss modules
        self._device_fences = 0     # fences after optimizer steps (defer_device_reads)
        self._hook_seconds = 0.0    # the training thread's time in Sonde's hooks (_timed)
        self._gradient_fences = 0   # fences at the end of backward (defer_device_reads)
        self.defer_device_reads = bool(defer_device_reads)
        if self.defer_device_reads:
            # torch.optim's package may not keep its submodule as an attribute.
            register = getattr(importlib.import_module("torch.optim.optimizer"),
                               "register_optimizer_step_post_hook", None)
            if register is None:
                log.warning("sonde: defer_device_reads needs torch >= 2.0 (a hook after every "
                            "optimizer step); device reads are not deferred")
                self.defer_device_reads = False
            else:
                self._handles.append(register(self._after_optimizer_step))
        if profiler is True:
            profiler = ProfilerConfig()
        if profiler is not None and profiler is not False and \
                not isinstance(profiler, ProfilerConfig):
            raise TypeError("profiler must be True, False or a sonde ProfilerConfig")
        self.profiler = profiler or None
        self._forward_start = 0      # micros: the model's forward began
        self._backward_start = 0     # micros: the loss's gradient was computed
        self._dataloader_workers = None  # last framework.dataloader_workers sent
        meta = {str(k): str(v) for k, v in (metadata or {}).items()}
        if export_tensorboard:
            meta.setdefault("sonde.tensorboard", "on")
        self._options = {
            "collector": collector or os.environ.get("SONDE_COLLECTOR") or "127.0.0.1:7070",
            "job": job or os.environ.get("SONDE_JOB") or "",
            # With include_workers="one" only rank 0 streams, as a job of one.
            "worker": self.worker if include_workers == "all" else 0,
            "world_size": self.world_size if include_workers == "all" else 1,
            "metadata": meta,
            "rules": rules if isinstance(rules, str) or rules is None else ";".join(rules),
            "token": token,
            "ca_file": ca_file,
            "cert_file": cert_file,
            "key_file": key_file,
            "server_name_override": server_name_override,
            "max_queue_bytes": max_queue_bytes,
            "backpressure": backpressure,
            "spill_dir": spill_dir,
            "max_spill_bytes": max_spill_bytes,
            "max_block_seconds": max_block_seconds,
            "close_timeout_seconds": close_timeout_seconds,
            "spool_dir": "" if spool_dir is False else (
                os.fspath(spool_dir) if spool_dir is not None else None),
            "max_spool_bytes": max_spool_bytes,
            "config_file": _config_file,
            "profiler": self.profiler._json() if self.profiler is not None else None,
            "defer_device_reads": self.defer_device_reads or None,
        }
        # Mistakes in the options are the user's, and surface here, before
        # training starts (ValueError), even in non-strict mode.
        err = _sonde.check_options(self._options_json())
        if err is not None:
            raise ValueError(err[1])
        atexit.register(_close_at_exit, weakref.ref(self))

    # ---- construction -------------------------------------------------

    @classmethod
    def create_from_json_file(cls, json_file_path=None, **kwargs):
        """A hook from SageMaker's hook-config JSON (HookParameters and
        CollectionConfigurations; Sonde reads "collector" and "job" from
        HookParameters too). The path defaults to $SONDE_CONFIG_FILE_PATH,
        $SMDEBUG_CONFIG_FILE_PATH, then SageMaker's
        /opt/ml/input/config/debughookconfig.json.

        kwargs are passed to Hook() (collector, job, credentials, strict,
        ...); a "collector" or "job" in the file wins over the kwargs; the
        file's "include_workers" applies unless given as a kwarg, and its
        "export_tensorboard": "true" acts as export_tensorboard=True. What
        to save comes from the file alone: save_config, reduction_config,
        include_regex, include_collections and save_all raise ValueError,
        and so does a collection customised through get_collection (at the
        first step), rather than being ignored."""
        given = [k for k in _FILE_CONFIG_KWARGS if kwargs.get(k)]
        if given:
            raise ValueError("%s cannot be combined with a hook config file, which says what to "
                             "save; put them in its HookParameters or CollectionConfigurations"
                             % ", ".join(given))
        if json_file_path is None:
            for env in CONFIG_FILE_ENV:
                if os.environ.get(env):
                    json_file_path = os.environ[env]
                    break
            else:
                json_file_path = DEFAULT_CONFIG_FILE
        if not os.path.isfile(json_file_path):
            raise FileNotFoundError("no hook config file at %s" % json_file_path)
        # The C++ hook reads the rest of the file (and rejects a malformed one).
        try:
            with open(json_file_path) as f:
                params = json.load(f).get("HookParameters") or {}
        except (ValueError, AttributeError):
            params = {}
        if isinstance(params, dict) and isinstance(params.get("include_workers"), str):
            kwargs.setdefault("include_workers", params["include_workers"].strip().lower())
        return cls(_config_file=json_file_path, **kwargs)

    def _config_json(self):
        collections = []
        included = set(self.include_collections)
        for name, c in self._collections.items():
            if c._customized() or name in included:
                collections.append(c._json())
        return {
            "save_config": self.save_config._json(),
            "reduction_config": (self.reduction_config._json()
                                 if self.reduction_config is not None else None),
            "include_regex": self.include_regex,
            "include_collections": self.include_collections,
            "save_all": self.save_all,
            "collections": collections,
        }

    def _options_json(self):
        options = {k: v for k, v in self._options.items() if v is not None}
        if not options.get("config_file"):
            options["config"] = self._config_json()
        return json.dumps(options)

    def _hook(self):
        """The native hook, created at the first step (so collections can be
        changed until then); None once disabled."""
        if self._native is None and not self._disabled and not self._closed:
            try:
                if self._options.get("config_file"):
                    customised = sorted(n for n, c in self._collections.items()
                                        if c._customized())
                    if customised:
                        # Known only now, in training: contained like any
                        # failure (strict raises).
                        raise ValueError(
                            "collection(s) %s were customised, but this hook reads what to save "
                            "from %s; put them in its CollectionConfigurations"
                            % (", ".join(customised), self._options["config_file"]))
                self._native = _sonde.Hook.create(self._options_json())
                _NATIVES.add(self._native)
                for c in self._collections.values():
                    for name in c.tensor_names:
                        self._native.add_to_collection(c.name, name)
                    if c.tensor_names or c.modules:
                        self._native.include_collection(c.name)
            except Exception as e:  # noqa: BLE001 - contained by design
                self._fail("could not start", e)
        return None if self._disabled else self._native

    # ---- collections --------------------------------------------------

    def get_collection(self, name):
        """The collection `name` (created if new). Changes apply until the
        first step; a collection changed here is saved."""
        c = self._collections.get(name)
        if c is None:
            c = Collection(name)
            self._collections[name] = c
        if self._native is not None:
            self._log_once("late-collection:" + name,
                           "collection '%s' was changed after the first step; only tensor names "
                           "and modules added later take effect" % name)
        return c

    def get_collections(self):
        return dict(self._collections)

    def add_to_collection(self, collection_name, args):
        """Adds tensor names (or a module's outputs) to a collection."""
        c = self.get_collection(collection_name)
        items = args if isinstance(args, (list, tuple)) else [args]
        for item in items:
            if isinstance(item, torch.nn.Module):
                c.add_module_tensors(item, outputs=True)
            else:
                c.add_tensor_name(str(item))
                if self._native is not None:
                    self._native.add_to_collection(c.name, str(item))
        if self._native is not None:
            self._native.include_collection(c.name)

    # ---- registration -------------------------------------------------

    def register_module(self, module):
        """Hooks a model: its forward starts each step and saves weights;
        every submodule's forward saves inputs and outputs; parameters that
        require grad save their gradients during backward."""
        if not isinstance(module, torch.nn.Module):
            raise TypeError("register_module needs a torch.nn.Module, not %s" % type(module))
        if id(module) in self._tops:
            raise ValueError("module %s is already registered" % module._get_name())
        top = module._get_name()
        for name, sub in module.named_modules():
            self._module_names[id(sub)] = name if name else top
        self._module_names[id(module)] = top
        self._tops.add(id(module))
        # Only the model's pre-hook stays for the whole run. Forward and
        # gradient hooks are added by the steps that save something and
        # removed when the next step starts, so on the other steps PyTorch
        # runs every submodule on its hook-free fast path.
        self._handles.append(module.register_forward_pre_hook(self._forward_pre_hook))
        if self._profiling():
            self._handles.append(module.register_forward_hook(self._profile_forward_end))
            _watch_dataloaders(self)
        self._watched.extend(module.modules())
        self._weights[id(module)] = [("%s_%s" % (top, pname), param)
                                     for pname, param in module.named_parameters()]
        # Every parameter: which require grad is asked at each saving step
        # (fine-tuning freezes and unfreezes layers after registration).
        for pname, param in module.named_parameters():
            self._gradients.append(("gradient/%s_%s" % (top, pname), param))

    register_hook = register_module  # the name in smdebug's older notebooks

    def register_loss(self, loss_module):
        """Saves a loss module's output as `<Loss>_output_0` in the collection
        "losses" (whatever the module's class is called) and its inputs as
        `<Loss>_input_<i>`."""
        if not isinstance(loss_module, torch.nn.Module):
            raise TypeError("register_loss needs a torch.nn.Module, not %s" % type(loss_module))
        self._module_names[id(loss_module)] = loss_module._get_name()
        self._losses.append(loss_module)
        if self._profiling():
            self._handles.append(loss_module.register_forward_hook(self._profile_loss))
        # Hooked by saving steps, as the model's modules. Only a registered
        # model's forward starts a step, so a loss saves nothing before one.
        self._watched.append(loss_module)

    def _step_modules(self):
        """The modules a saving step hooks, once each, with the collections
        that name modules (_module_collections); recomputed only when
        register_module/register_loss or a collection's add_module_tensors
        has changed them."""
        key = (len(self._watched), len(self._collections),
               sum(len(c.modules) for c in self._collections.values()))
        if key == self._modules_key:
            return self._hooked_modules
        modules = list(self._watched)
        self._module_collections = {}
        for c in self._collections.values():
            for (m, inputs, outputs) in c.modules:
                modules.append(m)
                self._module_collections.setdefault(id(m), []).append((c.name, inputs, outputs))
        for m in self._losses:
            # A registered loss's outputs are losses whatever its class is
            # called (the "losses" regex only knows names with "Loss").
            self._module_collections.setdefault(id(m), []).append(("losses", False, True))
        seen = set()
        self._hooked_modules = []
        for m in modules:
            if id(m) not in seen:
                seen.add(id(m))
                self._module_names.setdefault(id(m), m._get_name())
                self._hooked_modules.append(m)
        self._modules_key = key
        return self._hooked_modules

    def _plan(self):
        """What this saving step hooks: the modules whose inputs or outputs
        can be saved, and whether gradients and weights can be. From the
        collections due now (one call to the C++ hook) and the collections
        each name belongs to (asked again only when collections change): a
        step that saves weights and gradients hooks no module, so PyTorch
        runs every module on its hook-free path. A module counts by the names
        of its inputs and outputs (`<m>_input_<i>`, `<m>_output_<i>`); until
        one has run hooked, their number is unknown and it is hooked to see
        (not counted in modules_missed if it then does not run).
        (hooked, gradients?, weights?, the hooked modules known to be due)."""
        h = self._native
        due = frozenset(h.due_collections())
        modules = self._step_modules()
        trained = tuple(p.requires_grad for _, p in self._gradients)
        key = (due, h.collections_version(), self._modules_key, self._mode,
               trained, len(self._weights), len(self._arity))
        if key == self._plan_key:
            return self._plan_value

        def any_due(names):
            if "all" in due:
                return True
            return bool(names) and any(due.intersection(c) for c in h.collections_of(names))

        everything = bool(due & {"all", "inputs", "outputs"})
        hooked, candidates = [], []
        for m in modules:
            extra = self._module_collections.get(id(m), ())
            if everything or any(c in due for (c, _, _) in extra):
                hooked.append(m)
            else:
                candidates.append(m)
        probing = []
        if candidates:
            names, owner = [], []
            for k, m in enumerate(candidates):
                n = self._module_names[id(m)]
                inputs, outputs = self._arity.get(id(m), (1, 1))
                module_names = ["%s_input_%d" % (n, i) for i in range(inputs)] + \
                    ["%s_output_%d" % (n, i) for i in range(outputs)]
                names += module_names
                owner += [k] * len(module_names)
            is_due = [False] * len(candidates)
            for k, member in zip(owner, h.collections_of(names) if names else []):
                is_due[k] = is_due[k] or bool(due.intersection(member))
            for k, m in enumerate(candidates):
                if is_due[k]:
                    hooked.append(m)
                elif id(m) not in self._arity:
                    probing.append(m)  # a later input or output may be due
        gradients = self._mode not in (_modes.EVAL, _modes.PREDICT) and \
            any_due([n for (n, _), t in zip(self._gradients, trained) if t])
        weights = any_due([n for ws in self._weights.values() for n, _ in ws])
        self._plan_key = key
        self._plan_value = (tuple(hooked + probing), gradients, weights, tuple(hooked))
        return self._plan_value

    def _hook_step(self, plan):
        """Adds the forward and gradient hooks of a saving step's plan; they
        stay while the next steps save by the same plan."""
        modules, gradients = plan[0], plan[1]
        for m in modules:
            self._step_handles.append(m.register_forward_hook(self._forward_hook))
        if gradients:
            for name, param in self._gradients:
                if param.requires_grad:  # frozen ones have no gradient (and refuse hooks)
                    self._step_handles.append(param.register_hook(self._gradient_hook(name)))
        self._hooked_plan = plan

    def _unhook_step(self):
        for handle in self._step_handles:
            handle.remove()
        self._step_handles = []
        self._hooked_plan = None

    def fence_device(self):
        """With defer_device_reads: the training stream waits (on the GPU,
        the host does not) for the statistics of the CUDA tensors saved so
        far. Call it before overwriting a saved tensor other than through a
        torch.optim optimizer's step or the next step."""
        self._native_call("fence_device")
        self._unfenced_copies = []

    def _after_optimizer_step(self, optimizer, args, kwargs):
        h = self._native
        if h is None or self._disabled or os.getpid() != self._pid:
            return
        try:
            h.fence_device()
            self._unfenced_copies = []
            self._device_fences += 1
        except Exception as e:  # noqa: BLE001
            self._fail("fencing device reads after an optimizer step", e)

    def _unhook_all(self):
        """Removes every hook Sonde put on the models, losses and parameters.
        Not for _fail, which may run inside autograd: the next step start
        (or close) calls this once the hook is disabled."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._unhook_step()
        self._due = False
        _unwatch_dataloaders(self)

    # ---- steps and modes ----------------------------------------------

    def set_mode(self, mode):
        """TRAIN, EVAL, PREDICT or GLOBAL (sonde.modes); ends the open step."""
        mode = _modes.ModeKeys(mode)
        self._mode = mode
        h = self._hook()
        if h is not None:
            self._native_call("set_mode", int(mode))

    def get_mode(self):
        return self._mode

    @property
    def step(self):
        step = self._native_call("step")
        return -1 if step is None else step

    @property
    def mode_step(self):
        step = self._native_call("mode_step")
        return -1 if step is None else step

    def _start_step(self):
        h = self._hook()
        if h is None:
            if self._handles or self._step_handles:
                self._unhook_all()  # disabled: leave the model as it was
            return
        if self._profiling():
            self._forward_start = _now_micros()  # this step's forward begins
        self._account_modules()
        self._calls = {}
        if self._grad_flush_queued:
            # The last backward raised before its end callback ran (autograd
            # drops it): its gradients were never saved.
            self._grad_items, self._grad_keep = [], []
            self._grad_flush_queued = False
            self._log_once("backward-failed", "a backward pass failed before it ended; its "
                           "gradients were not saved")
        if self.raise_on_stop and not self._stop_raised and self.should_stop():
            self._stop_raised = True
            raise StopTrainingRequested(self.stop_action())
        try:
            h.start_step()  # fences the last step's reads
            self._unfenced_copies = []
            self._due = h.step_may_save()
            if self._due:
                plan = self._plan()
                if plan is not self._hooked_plan:
                    self._unhook_step()
                    self._hook_step(plan)
            elif self._step_handles:
                self._unhook_step()
        except Exception as e:  # noqa: BLE001
            self._fail("start_step", e)
            self._unhook_all()

    def _account_modules(self):
        """After a saving step: counts the modules it hooked whose forward
        hook never ran eagerly (inside torch.compile'd code, or not called
        in that step), whose inputs and outputs were therefore not saved,
        and says so once."""
        if not self._due or self._hooked_plan is None:
            return
        ran, self._ran = self._ran, set()
        missed = [m for m in self._hooked_plan[3] if id(m) not in ran]
        if not missed:
            return
        self._modules_missed += len(missed)
        names = ", ".join(self._module_names.get(id(m), "?") for m in missed[:8])
        if len(missed) > 8:
            names += ", ..."
        self._log_once("modules_missed",
                       "the inputs and outputs of %d module(s) hooked for a saving step were "
                       "not saved: %s (they ran inside torch.compile'd code, where Sonde saves "
                       "no module inputs or outputs, or were not called in that step; counted "
                       "in counters()['modules_missed'])" % (len(missed), names))

    # The hooks PyTorch calls: under torch.compile they trace to nothing or
    # run eagerly, never into a graph (see _compile.py).

    def _forward_pre_hook(self, module, inputs):
        # nn.DataParallel's replicas carry copies of these hooks and run them
        # on their own threads, every forward: the registered model's own
        # call begins the step, not theirs. A registered model that only
        # runs as replicas (the model inside the DataParallel) begins none:
        # said once, since nothing is saved then.
        if getattr(module, "_is_replica", False):
            self._log_once("replica", "a registered model runs as nn.DataParallel replicas, "
                           "which begin no step and save nothing: register the DataParallel "
                           "module itself (hook.register_module(dp)) so that its forward "
                           "begins the steps")
            return
        # Inlined (the model called from a compiled function): a graph break
        # begins the step eagerly, unless breaks are errors there.
        if not (_compile.is_compiling() and _compile.breaks_forbidden()):
            _call_eagerly(self._begin_forward, module, inputs)

    def _forward_hook(self, module, inputs, outputs):
        # A DataParallel replica's tensors are slices of the batch on other
        # threads, named like the module's: not saved (the module's hook
        # not running is counted by _account_modules).
        if getattr(module, "_is_replica", False):
            return
        if not _compile.is_compiling():  # inlined: counted by _account_modules
            _call_eagerly(self._save_module_tensors, module, inputs, outputs)

    def _profile_forward_end(self, module, inputs, outputs):
        if not _compile.is_compiling():
            _call_eagerly(self._end_forward, module, inputs, outputs)

    def _profile_loss(self, module, inputs, outputs):
        if not _compile.is_compiling():
            _call_eagerly(self._watch_loss, module, inputs, outputs)

    @_timed
    def _begin_forward(self, module, inputs):
        self._began_step = True
        self._start_step()
        if not self._due or not self._plan_value[2]:
            return
        try:
            items, keep, streams = [], [], {}
            for name, param in self._weights.get(id(module), ()):
                self._collect_param(items, keep, name, param, streams)
            self._save_items(items)
        except Exception as e:  # noqa: BLE001
            self._fail("saving weights", e)

    @_timed
    def _save_module_tensors(self, module, inputs, outputs):
        if not self._due or self._disabled:
            return
        self._ran.add(id(module))
        try:
            name = self._module_names.get(id(module))
            if name is None:
                return
            # A module called again in the step (one nn.ReLU used after
            # every layer): its tensors are other tensors, named apart
            # (`relu_output_0`, then `relu_output_0_call1`, ...), not the
            # same name sent twice.
            call = self._calls.get(id(module), 0)
            self._calls[id(module)] = call + 1
            suffix = "_call%d" % call if call else ""
            extra = self._module_collections.get(id(module), ())
            items, keep = [], []
            in_colls = ["inputs"] + [c for (c, i, _) in extra if i]
            out_colls = ["outputs"] + [c for (c, _, o) in extra if o]
            inputs, outputs = list(_flatten(inputs)), list(_flatten(outputs))
            if id(module) not in self._arity:  # the names later plans ask about
                self._arity[id(module)] = (len(inputs), len(outputs))
            for i, t in enumerate(inputs):
                self._collect(items, keep, "%s_input_%d%s" % (name, i, suffix), t.detach(),
                              in_colls)
            for i, t in enumerate(outputs):
                self._collect(items, keep, "%s_output_%d%s" % (name, i, suffix), t.detach(),
                              out_colls)
            self._save_items(items)
        except Exception as e:  # noqa: BLE001
            self._fail("saving module tensors", e)

    def _gradient_hook(self, name):
        def hook(grad):
            if _compile.is_compiling() or not self._due or self._disabled or grad is None:
                return None  # compiled autograd traces gradient hooks
            start = time.perf_counter()
            try:
                self._collect_param(self._grad_items, self._grad_keep, name, grad, None)
                if self._grad_items and not self._grad_flush_queued:
                    # Runs when autograd's engine has finished this backward
                    # pass, on the caller's current stream, which the engine
                    # has made wait for every gradient.
                    self._grad_flush_queued = True
                    torch.autograd.Variable._execution_engine.queue_callback(
                        self._flush_gradients)
            except Exception as e:  # noqa: BLE001
                self._fail("saving gradients", e)
            self._hook_seconds += time.perf_counter() - start
            return None
        return hook

    @_timed
    def _flush_gradients(self):
        """Saves the gradients of the backward pass that just ended, in one
        native call (all CUDA gradients of a device and stream share one
        statistics batch)."""
        # The kept tensors stay alive (referenced here) until save_many has
        # copied or enqueued them.
        items, _kept = self._grad_items, self._grad_keep
        self._grad_items, self._grad_keep = [], []
        self._grad_flush_queued = False
        if not items or self._disabled or self._native is None:
            return
        try:
            if any(i[5] for i in items):
                # Each device's stream current now, which the engine has made
                # wait for the streams the gradients were computed on.
                streams = {}
                for i in items:
                    if i[5] and i[6] not in streams:
                        streams[i[6]] = torch.cuda.current_stream(i[6]).cuda_stream
                items = [i[:7] + (streams[i[6]],) if i[5] else i for i in items]
            self._save_items(items)
            if self.defer_device_reads:
                # Gradients are not left to deferred reads: loops change them
                # in place between backward and the optimizer's step
                # (clipping, AMP's unscaling), which no hook announces.
                self._native.fence_device()
                self._unfenced_copies = []
                self._gradient_fences += 1
        except SondeError:
            raise
        except Exception as e:  # noqa: BLE001
            self._fail("saving gradients", e)

    # ---- profiler -----------------------------------------------------

    def _profiling(self):
        return self.profiler is not None and self.profiler.framework and not self._disabled

    @contextlib.contextmanager
    def span(self, name):
        """Times the block as a named span of the current step:
            with hook.span("augment"): ..."""
        start = _now_micros()
        try:
            yield
        finally:
            self._record(_KIND.KIND_SPAN, name, start, _now_micros())

    def _record(self, kind, name, start, end):
        h = self._native
        if h is None or not self._profiling():
            return
        try:
            h.record_event(kind, name, start, end)  # the C++ hook clamps end >= start
        except Exception as e:  # noqa: BLE001
            self._fail("recording a profiler event", e)

    def _end_forward(self, module, inputs, outputs):
        if self._forward_start:
            self._record(_KIND.KIND_FORWARD, "", self._forward_start, _now_micros())
            self._forward_start = 0

    def _watch_loss(self, module, inputs, outputs):
        """The loss's gradient is the first computed in backward."""
        if not self._profiling():
            return
        for t in _flatten(outputs):
            if t.requires_grad:
                t.register_hook(self._profile_backward_begins)
                break

    def _profile_backward_begins(self, grad):
        """Backward has begun: times it until autograd's engine finishes
        (one callback per backward, instead of a hook on every parameter)."""
        if not _compile.is_compiling() and self._profiling():
            self._backward_start = _now_micros()
            torch.autograd.Variable._execution_engine.queue_callback(self._profile_backward_ends)
        return None

    def _profile_backward_ends(self):
        if self._backward_start:
            self._record(_KIND.KIND_BACKWARD, "", self._backward_start, _now_micros())
            self._backward_start = 0

    def _data_wait(self, start, end, workers):
        if not self._profiling():
            return
        self._record(_KIND.KIND_DATA_WAIT, "", start, end)
        if workers != self._dataloader_workers:
            self._dataloader_workers = workers
            self._native_call("set_profiler_gauge", "framework.dataloader_workers",
                              float(workers))

    # ---- saving -------------------------------------------------------

    def _collect(self, items, keep, name, t, collections):
        """Appends the native save tuple for tensor `t` if it is due."""
        h = self._native
        if h is None or not h.should_save(name, collections):
            return
        self._append_item(items, keep, name, t, collections, {})

    def _collect_param(self, items, keep, name, t, streams):
        """_collect for weights and gradients, the tensors of every saving
        step: no should_save call (the C++ hook decides in save_many, and
        the plan already asked whether these collections are due), no
        detach (only the pointer is read)."""
        self._append_item(items, keep, name, t, [], streams)

    def _append_item(self, items, keep, name, t, collections, streams):
        """Appends the native save tuple of `t`. `streams` caches each
        device's current stream for one call ({}: look them up now), or is
        None: the stream is set when the items are saved (gradients)."""
        why = None
        if t.dtype not in _DTYPES:
            why = "dtype %s is not supported" % t.dtype
        elif t.device.type not in ("cpu", "cuda"):
            # meta tensors have no memory; other devices' memory is not ours to read
            why = "tensors on a %s device are not supported" % t.device.type
        elif t.layout not in (torch.strided, torch.sparse_coo):
            why = "layout %s is not supported" % t.layout
        elif t.is_cuda and t.dtype not in _CUDA_DTYPES:
            why = ("%s on a GPU would need a copy to the host that waits for the GPU"
                   % t.dtype)
        if why is not None:
            self._log_once("unreadable:" + name, "tensor '%s' not saved: %s" % (name, why))
            # Refused by the native hook (no dtype), which counts it as a
            # dropped tensor of this step when it was due: the gap shows.
            items.append((name, 0, tensor_pb2.DTYPE_UNSPECIFIED, [0], collections, 0, 0, 0))
            return
        dtype = _DTYPES[t.dtype]
        original = t
        if t.is_sparse:
            t = t.to_dense()
        if not t.is_contiguous():
            t = t.contiguous()
        if t is not original and t.is_cuda and self.defer_device_reads:
            self._unfenced_copies.append(t)
        if t.is_cuda:
            device = t.device.index or 0
            stream = 0
            if streams is not None:
                stream = streams.get(device)
                if stream is None:
                    stream = streams[device] = torch.cuda.current_stream(t.device).cuda_stream
            items.append((name, t.data_ptr(), dtype, list(t.shape), collections, 1, device, stream))
        else:
            items.append((name, t.data_ptr(), dtype, list(t.shape), collections, 0, 0, 0))
        keep.append(t)  # alive until the native call has copied or enqueued it

    def _save_items(self, items):
        if not items:
            return
        err = self._native.save_many(items)
        if err is not None:
            self._refused(err, ", ".join(i[0] for i in items[:3]))

    def _refused(self, err, what):
        code, message = err
        if self.strict:
            raise SondeError("%s: %s" % (code, message))
        self._log_once("refused:%s:%s" % (code, what), "%s not saved: %s" % (what, message))

    def save_tensor(self, tensor_name, tensor_value, collections_to_write="default"):
        """Saves a tensor (torch, numpy or a Python number) at the current
        step into these collections, which are saved from now on with their
        own save config (else the hook's)."""
        if isinstance(collections_to_write, str):
            collections_to_write = [collections_to_write]
        h = self._hook()
        if h is None:
            return
        try:
            for c in collections_to_write:
                h.include_collection(c)
            if isinstance(tensor_value, torch.Tensor):
                tensor = tensor_value.detach()
            else:
                tensor = _from_numpy(tensor_value)
            items, keep = [], []
            self._collect(items, keep, tensor_name, tensor, list(collections_to_write))
            self._save_items(items)
        except SondeError:
            raise
        except Exception as e:  # noqa: BLE001
            self._fail("save_tensor", e)

    def save_scalar(self, name, value, sm_metric=False, timestamp=None):
        """Saves a scalar in the "scalars" collection at the current step.
        A CUDA tensor is measured on the device (no .item() sync).
        sm_metric and timestamp are accepted for smdebug compatibility and
        ignored (the collector stamps the step's time)."""
        h = self._hook()
        if h is None:
            return
        try:
            h.include_collection("scalars")
            if isinstance(value, torch.Tensor):
                items, keep = [], []
                self._collect(items, keep, name, value.detach().reshape(()), ["scalars"])
                self._save_items(items)
                return
            err = h.save_scalar(name, float(value), ["scalars"])
            if err is not None:
                self._refused(err, name)
        except SondeError:
            raise
        except Exception as e:  # noqa: BLE001
            self._fail("save_scalar", e)

    # ---- stop, flush, close -------------------------------------------

    def should_stop(self):
        """True once a rule's StopTraining action has reached this process.

        With include_workers="one" (the default) only rank 0 talks to the
        collector, so only rank 0 sees the stop; the other ranks would go on
        (and a collective would then hang). Broadcast it, e.g. every step:
            stop = torch.tensor([float(hook.should_stop())])
            torch.distributed.all_reduce(stop, op=torch.distributed.ReduceOp.MAX)
            if stop.item(): break
        With include_workers="all" the collector sends the action to every
        rank, but each sees it at its own step: the same all_reduce keeps
        them together."""
        return bool(self._native_call("should_stop"))

    def stop_action(self):
        """The StopTraining action (rule, reason, step), or None."""
        return self._native_call("stop_action")

    def wait_until_connected(self, timeout_seconds=10.0):
        """Waits until the collector has accepted the job (and told the hook
        what its rules need). Training never has to call this."""
        h = self._hook()
        if h is None:
            return False
        return h.wait_until_connected(float(timeout_seconds)) is None

    def flush(self, timeout_seconds=30.0):
        """Ends the open step and waits until the collector has stored
        everything saved so far. True on success."""
        h = self._native
        if self._disabled:
            return False
        if h is None:
            return True
        err = self._native_call("flush", float(timeout_seconds))
        if self._disabled:
            return False
        if err is not None:
            self._log_once("flush:" + err[0], "flush: " + err[1])
        return err is None

    def counters(self):
        """The native hook's counters (saved, dropped, spilled, resent...),
        and modules_missed: modules hooked for a saving step whose forward
        hook never ran eagerly (see docs/python.md, "torch.compile")."""
        h = self._native
        counters = h.counters() if h is not None else {}
        counters["modules_missed"] = self._modules_missed
        counters["hook_seconds"] = self._hook_seconds
        return counters

    @property
    def disabled(self):
        return self._disabled

    def close(self):
        """Ends the step and the job, waits (up to close_timeout_seconds) for
        the collector to store everything, and unhooks the model."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:
            return  # a forked child: the C++ hook's threads live in the parent only
        self._account_modules()
        if self._tops and not self._began_step:
            self._log_once("no_steps", "no step began: the registered model's forward never "
                           "ran its hooks eagerly (called only from a function compiled with "
                           "torch.compile(fullgraph=True)?); nothing of it was saved")
        self._unhook_all()
        h = self._native
        if h is None:
            return
        try:
            err = h.close()
        except Exception as e:  # noqa: BLE001
            if self.strict:
                raise SondeError("close: %s" % e) from e
            log.warning("sonde: close failed: %s", e)
            return
        if err is not None:
            if self.strict:
                raise SondeError("close: %s: %s" % err)
            log.warning("sonde: close: %s", err[1])

    def _forked(self):
        """In a forked child (a DataLoader worker, a multiprocessing 'fork'
        process): the C++ hook's threads and connection live in the parent
        only, so this copy of the hook does nothing from now on."""
        self._disabled = True
        self._closed = True
        self._due = False
        self._native = None  # kept in _FORKED_NATIVES

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ---- containment --------------------------------------------------

    def _native_call(self, method, *args):
        """The C++ hook's `method`(*args), or None when there is none. A
        failure is contained: logged once and Sonde disabled (strict mode
        raises SondeError)."""
        h = self._native
        if h is None:
            return None
        try:
            return getattr(h, method)(*args)
        except Exception as e:  # noqa: BLE001
            self._fail(method, e)
            return None

    def _log_once(self, key, message):
        if key in self._logged:
            return
        self._logged.add(key)
        log.warning("sonde: %s (logged once)", message)

    def _fail(self, where, error):
        """A failure inside Sonde: raise in strict mode, else log once and
        stop hooking (training goes on untouched)."""
        if self.strict:
            raise SondeError("%s: %s" % (where, error)) from error
        if not self._disabled:
            log.error("sonde: %s failed (%s: %s); Sonde is disabled for the rest of this run, "
                      "training continues", where, type(error).__name__, error, exc_info=True)
        self._disabled = True
        self._due = False


def _call_eagerly(fn, *args):
    """fn(*args), never traced by dynamo: from traced code, a graph break."""
    return fn(*args)


_call_eagerly = _compile.disable(_call_eagerly)
# The hooks of the module torch.compile was given run as frames of their own:
# run them eagerly (inlined into a graph they trace to nothing instead).
_compile.skip_frames(Hook._forward_pre_hook, Hook._forward_hook, Hook._profile_forward_end,
                     Hook._profile_loss)

# Every hook of this process, so a forked child can disable its copies, and
# every C++ hook, also those only a reference cycle still holds.
_LIVE_HOOKS = weakref.WeakSet()
_NATIVES = weakref.WeakSet()
# A forked child's copies of the parent's C++ hooks. Destroying one would
# join threads that only exist in the parent (std::system_error, or a
# crash), so they are kept here, with an extra reference that interpreter
# shutdown cannot drop, and never destroyed.
_FORKED_NATIVES = []


def _after_fork_in_child():
    for native in list(_NATIVES):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(native))
        _FORKED_NATIVES.append(native)
    for hook in list(_LIVE_HOOKS):
        hook._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _now_micros():
    return time.time_ns() // 1000


# Hooks whose profiler times the DataLoader. While there are any, torch's
# DataLoader iterators' __next__ is patched: each batch fetched is a data
# wait. The last such hook to close puts the original back.
_PROFILED_HOOKS = weakref.WeakSet()
_TIMED_NEXT = None  # the patched __next__, while it is installed


def _watch_dataloaders(hook):
    global _TIMED_NEXT
    _PROFILED_HOOKS.add(hook)
    if _TIMED_NEXT is not None:
        return
    base = torch.utils.data.dataloader._BaseDataLoaderIter
    original = base.__next__

    def timed_next(self):
        if not _PROFILED_HOOKS:
            return original(self)
        start = _now_micros()
        # The StopIteration that ends an epoch propagates unrecorded: no
        # batch was waited for.
        batch = original(self)
        end = _now_micros()
        # Worker processes loading batches (0: the training process itself).
        workers = getattr(self, "_num_workers", 0)
        for h in list(_PROFILED_HOOKS):
            h._data_wait(start, end, workers)
        return batch

    timed_next.__wrapped__ = original
    base.__next__ = timed_next
    _TIMED_NEXT = timed_next


def _unwatch_dataloaders(hook):
    global _TIMED_NEXT
    _PROFILED_HOOKS.discard(hook)
    if _PROFILED_HOOKS or _TIMED_NEXT is None:
        return
    base = torch.utils.data.dataloader._BaseDataLoaderIter
    if base.__next__ is _TIMED_NEXT:  # not patched again by someone else since
        base.__next__ = _TIMED_NEXT.__wrapped__
    _TIMED_NEXT = None


def _close_at_exit(ref):
    hook = ref()
    if hook is not None:
        try:
            hook.close()
        except Exception:  # noqa: BLE001 - never fail interpreter exit
            pass


_GLOBAL_HOOK = None


def get_hook(json_config_path=None, create_if_not_exists=False, **kwargs):
    """The process's hook, as smdebug's get_hook: the one made here before,
    else one from the hook-config JSON file when there is one (the path, or
    $SONDE_CONFIG_FILE_PATH / $SMDEBUG_CONFIG_FILE_PATH), else a new hook
    from kwargs and $SONDE_COLLECTOR / $SONDE_JOB when create_if_not_exists,
    else None. In a forked child it is the parent's hook, disabled there
    (never a new one: the child would be a second worker of the job)."""
    global _GLOBAL_HOOK
    if _GLOBAL_HOOK is not None and (not _GLOBAL_HOOK._closed or
                                     _GLOBAL_HOOK._pid != os.getpid()):
        # In a forked child this is the parent's hook, disabled: a child
        # must not start a second job or worker of its own.
        return _GLOBAL_HOOK
    path = json_config_path
    if path is None:
        path = next((os.environ[e] for e in CONFIG_FILE_ENV if os.environ.get(e)), None)
    if path is None and os.path.isfile(DEFAULT_CONFIG_FILE):
        path = DEFAULT_CONFIG_FILE
    if path is not None:
        _GLOBAL_HOOK = Hook.create_from_json_file(path, **kwargs)
    elif create_if_not_exists:
        _GLOBAL_HOOK = Hook(**kwargs)
    else:
        return None
    return _GLOBAL_HOOK
