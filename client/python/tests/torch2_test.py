"""sonde.torch with what torch 2.x adds: torch.compile'd models and full
backward hooks, on a real collector.

Under torch.compile (see sonde/torch/_compile.py and docs/python.md):
steps, weights, biases, gradients, losses computed outside the compiled
code and the compiled model's own output are saved as in eager mode; the
inputs and outputs of modules inside the compiled graph are not, and are
counted in counters()["modules_missed"]. Nothing Sonde does breaks the
graph, so fullgraph=True trains. The compile cases skip on PyTorch without
torch.compile (Debian's 1.13); deploy/check-wheel.sh --pypi-torch runs them
against the newest PyTorch.
"""

import importlib
import logging
import shutil

import numpy as np
import pytest
import torch
import torch.nn as nn

import sonde.torch as smd
from sonde import modes
from sonde.trials import create_trial

needs_compile = pytest.mark.skipif(
    not hasattr(torch, "compile"),
    reason="torch %s has no torch.compile (PyTorch 2.0+)" % torch.__version__)

STEPS = 12
INTERVAL = 4
SAVED = [0, 4, 8]


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def _data(n=STEPS):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g))
            for _ in range(n)]


def _hook(collector, job):
    return smd.Hook(collector=collector.address, job=job, strict=True,
                    save_config=smd.SaveConfig(save_interval=INTERVAL),
                    include_collections=["weights", "biases", "gradients", "losses",
                                         "outputs"])


def _train(hook, model, call, loss_fn):
    """Trains STEPS steps through `call(x, y) -> loss`; returns the
    model's fc1.weight as it was when each saved step began."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.set_mode(modes.TRAIN)
    seen = {}
    for i, (x, y) in enumerate(_data()):
        if i in SAVED:
            seen[i] = model.fc1.weight.detach().clone().numpy()
        opt.zero_grad()
        call(x, y).backward()
        opt.step()
    return seen


def _compiled(kind, model, loss_fn, backend="aot_eager", fullgraph=True):
    if kind == "torch.compile(model)":
        compiled = torch.compile(model, backend=backend, fullgraph=fullgraph)
        return lambda x, y: loss_fn(compiled(x), y)
    if kind == "model.compile()":
        if not hasattr(nn.Module, "compile"):
            pytest.skip("nn.Module.compile is torch 2.2+")
        model.compile(backend=backend, fullgraph=fullgraph)
        return lambda x, y: loss_fn(model(x), y)
    raise ValueError(kind)


def _check_compiled_model_run(collector, job, hook, seen):
    trial = create_trial(collector.address, job)
    names = trial.tensor_names()
    # Everything that runs outside the compiled graph, at every saved step.
    for name in ["Mlp_fc1.weight", "Mlp_fc2.weight", "Mlp_fc1.bias", "gradient/Mlp_fc1.weight",
                 "gradient/Mlp_fc2.bias", "CrossEntropyLoss_output_0", "Mlp_output_0"]:
        assert name in names, (name, names)
        assert trial.tensor(name).steps() == SAVED, name
    for step in SAVED:  # the weights as they were when the step began, bit for bit
        np.testing.assert_array_equal(trial.tensor("Mlp_fc1.weight").value(step), seen[step])
    # Inside the graph: not saved, and counted (3 submodules, 3 saved steps).
    assert not [n for n in names if n.startswith(("fc1_", "act_", "fc2_"))], names
    counters = hook.counters()
    assert counters["modules_missed"] == 3 * len(SAVED)
    assert counters["tensors_dropped"] == 0 and counters["values_dropped"] == 0


@needs_compile
@pytest.mark.parametrize("kind", ["torch.compile(model)", "model.compile()"])
@pytest.mark.parametrize("fullgraph", [True, False])
def test_a_compiled_model_trains_and_saves_what_runs_outside_its_graph(
        collector, caplog, kind, fullgraph):
    torch.manual_seed(0)
    model, loss_fn = Mlp(), nn.CrossEntropyLoss()
    job = "compiled-%s-%s" % (kind.split("(")[0].replace(".", "-"), fullgraph)
    hook = _hook(collector, job)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    call = _compiled(kind, model, loss_fn, fullgraph=fullgraph)
    with caplog.at_level(logging.WARNING, logger="sonde"):
        seen = _train(hook, model, call, loss_fn)
        hook.close()
    _check_compiled_model_run(collector, job, hook, seen)
    warnings = [r.getMessage() for r in caplog.records if "modules_missed" in r.getMessage()]
    assert len(warnings) == 1 and "fc1, act, fc2" in warnings[0], warnings


@needs_compile
def test_a_compiled_training_step_without_fullgraph_still_begins_steps(collector):
    """The model is called from a compiled function: its pre-hook breaks
    the graph once per call, so steps begin and weights are saved."""
    torch.manual_seed(0)
    model, loss_fn = Mlp(), nn.CrossEntropyLoss()
    hook = _hook(collector, "compiled-step")
    hook.register_module(model)
    hook.register_loss(loss_fn)
    step = torch.compile(lambda x, y: loss_fn(model(x), y), backend="aot_eager")
    seen = _train(hook, model, step, loss_fn)
    hook.close()
    trial = create_trial(collector.address, "compiled-step")
    assert trial.tensor("Mlp_fc1.weight").steps() == SAVED
    for s in SAVED:
        np.testing.assert_array_equal(trial.tensor("Mlp_fc1.weight").value(s), seen[s])
    assert trial.tensor("gradient/Mlp_fc2.weight").steps() == SAVED
    assert hook.counters()["modules_missed"] > 0  # the loss and submodules, in the graph


@needs_compile
def test_a_fullgraph_training_step_trains_and_says_nothing_was_saved(collector, caplog):
    """With fullgraph=True nothing may break the graph, so the hooks trace
    to nothing: training runs, no step begins, and close() says so."""
    torch.manual_seed(0)
    model, loss_fn = Mlp(), nn.CrossEntropyLoss()
    reference = Mlp()
    reference.load_state_dict(model.state_dict())
    hook = _hook(collector, "fullgraph-step")
    hook.register_module(model)
    hook.register_loss(loss_fn)
    step = torch.compile(lambda x, y: loss_fn(model(x), y), backend="aot_eager", fullgraph=True)
    with caplog.at_level(logging.WARNING, logger="sonde"):
        _train(hook, model, step, loss_fn)
        hook.close()
    # Training itself went as without Sonde.
    _train(_NoHook(), reference, lambda x, y: loss_fn(reference(x), y), loss_fn)
    np.testing.assert_allclose(model.fc1.weight.detach().numpy(),
                               reference.fc1.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert not hook.disabled
    assert any("no step began" in r.getMessage() for r in caplog.records)


class _NoHook:
    def set_mode(self, mode):
        pass


@needs_compile
@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("cc") is None,
                    reason="inductor needs a C++ compiler")
def test_inductor_fullgraph(collector):
    """The default backend (inductor, which compiles C++ on the CPU)."""
    torch.manual_seed(0)
    model, loss_fn = Mlp(), nn.CrossEntropyLoss()
    hook = _hook(collector, "inductor")
    hook.register_module(model)
    hook.register_loss(loss_fn)
    call = _compiled("torch.compile(model)", model, loss_fn, backend="inductor")
    seen = _train(hook, model, call, loss_fn)
    hook.close()
    _check_compiled_model_run(collector, "inductor", hook, seen)


def test_full_backward_hooks_of_the_user_and_sondes_hooks_both_work(collector):
    """A model with the user's own full backward hooks (and a module that
    changes its input in place, which such hooks are strict about): both
    kinds of hooks run, and what Sonde saves equals what the model computed."""
    torch.manual_seed(0)
    model, loss_fn = Mlp(), nn.CrossEntropyLoss()
    grads_seen = []
    model.fc2.register_full_backward_hook(
        lambda module, grad_in, grad_out: grads_seen.append(grad_out[0].detach().clone()))
    outputs = []
    model.act.register_forward_hook(lambda m, i, o: outputs.append(o.detach().clone()))
    hook = smd.Hook(collector=collector.address, job="full-backward", strict=True,
                    save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients", "losses", "outputs"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.set_mode(modes.TRAIN)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for x, y in _data(3):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        grads.append(model.fc1.weight.grad.detach().clone())
        opt.step()
    hook.close()
    assert len(grads_seen) == 3  # the user's hook ran every backward
    trial = create_trial(collector.address, "full-backward")
    for step in range(3):
        np.testing.assert_array_equal(trial.tensor("act_output_0").value(step),
                                      outputs[step].numpy())
        np.testing.assert_array_equal(trial.tensor("gradient/Mlp_fc1.weight").value(step),
                                      grads[step].numpy())
    assert hook.counters()["modules_missed"] == 0


_optimizer_module = importlib.import_module("torch.optim.optimizer")
needs_optimizer_hooks = pytest.mark.skipif(
    not hasattr(_optimizer_module, "register_optimizer_step_post_hook"),
    reason="torch %s has no global optimizer step hooks (PyTorch 2.0+)" % torch.__version__)


@needs_optimizer_hooks
def test_deferred_device_reads_fence_after_every_optimizer_step_until_close(collector):
    hook = smd.Hook(collector=collector.address, job="deferred", strict=True,
                    save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients"], defer_device_reads=True)
    assert hook.defer_device_reads
    model = Mlp()
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    for x, y in _data(3):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    assert hook._device_fences == 3    # one after each step, the first included
    assert hook._gradient_fences == 3  # and one at the end of each backward pass
    hook.fence_device()                # on demand: nothing deferred on the CPU, still fine
    hook.close()
    opt.step()                         # the global step hook went with the hook
    assert hook._device_fences == 3
    trial = create_trial(collector.address, "deferred")
    assert trial.tensor("Mlp_fc1.weight").steps() == [0, 1, 2]
    assert trial.tensor("gradient/Mlp_fc1.weight").steps() == [0, 1, 2]


def test_deferred_device_reads_say_why_when_torch_cannot(collector, caplog, monkeypatch):
    monkeypatch.delattr(_optimizer_module, "register_optimizer_step_post_hook", raising=False)
    with caplog.at_level(logging.WARNING):
        hook = smd.Hook(collector=collector.address, job="no-defer", strict=True,
                        defer_device_reads=True)
    assert not hook.defer_device_reads
    assert "device reads are not deferred" in caplog.text
    hook.close()
