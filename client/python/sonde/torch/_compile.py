"""How Sonde's module hooks behave under torch.compile (torch 2.x).

Dynamo meets a hook in one of two ways:

* As a frame of its own: hooks of the module torch.compile was given
  (nn.Module.__call__ runs them outside the compiled forward). Such frames
  are marked with `skip_frames`, so they run eagerly, as without compile:
  steps begin, weights are saved, the compiled model's own output is saved.
* Inlined into a graph: hooks of submodules of a compiled model, or of a
  model called from a compiled function. Saving there would break the graph
  (an error under fullgraph=True), so hooks check `is_compiling()` and trace
  to nothing; the hook counts the modules whose inputs and outputs were
  therefore not saved. The one exception is the start of a step inside a
  compiled function: without fullgraph it breaks the graph once per call
  (`eager_start`), so steps still begin; with fullgraph it cannot.

Everything here is looked up once and degrades to "not compiling" on
PyTorch without torch.compile (1.x).
"""

import torch


def _lookup(*paths):
    for path in paths:
        obj = torch
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
            return obj
        except AttributeError:
            continue
    return None


# Importing torch._dynamo (torch 2.x; absent in 1.x) makes torch._dynamo.*
# reachable for _lookup below.
try:
    import torch._dynamo  # noqa: F401
except ImportError:
    pass

# True while dynamo traces (folded to a constant there), False when run.
is_compiling = _lookup("compiler.is_compiling", "_dynamo.is_compiling") or (lambda: False)

_disable = _lookup("compiler.disable", "_dynamo.disable")
_assume_constant = _lookup("compiler.assume_constant_result", "_dynamo.assume_constant_result")


def disable(fn):
    """fn, which dynamo never traces: a call to it from traced code is a
    graph break and runs eagerly."""
    return _disable(fn) if _disable is not None else fn


def skip_frames(*functions):
    """Frames of these functions' code run eagerly when dynamo meets them as
    frames of their own (inlining them is unaffected). Returns whether it
    could; without it such hooks trace to nothing too."""
    try:
        from torch._dynamo.eval_frame import skip_code
        for fn in functions:
            skip_code(getattr(fn, "__func__", fn).__code__)
        return True
    except Exception:  # noqa: BLE001 - a private API: absent or changed
        return False


def _breaks_forbidden():
    """Whether the graph being traced may not break (fullgraph=True, or
    error_on_graph_break). Run by dynamo while it traces; True when it
    cannot tell, since a break there would be an error."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        tx = InstructionTranslator.current_tx()
        return bool(getattr(tx, "one_graph", True) or getattr(tx, "error_on_graph_break", False))
    except Exception:  # noqa: BLE001 - a private API: absent or changed
        return True


if _assume_constant is not None:
    breaks_forbidden = _assume_constant(_breaks_forbidden)
else:
    def breaks_forbidden():
        return True
