"""The two halves together: sonde.torch.Hook writes, sonde.trials reads.

Values read through a Trial equal the model's tensors bit for bit, and a
Trial on a running job sees its steps as they arrive.
"""

import threading

import numpy as np
import torch
import torch.nn as nn

import sonde.torch as smd
from sonde import modes
from sonde.trials import StepState, create_trial


def make_model():
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def test_trial_reads_what_the_hook_saw_bit_for_bit(collector):
    model = make_model()
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    hook = smd.Hook(collector=collector.address, job="roundtrip", strict=True,
                    save_config=smd.SaveConfig(
                        save_interval=2,
                        mode_save_configs={modes.EVAL: smd.SaveConfigMode(save_interval=1)}),
                    include_collections=["weights", "biases", "gradients", "losses"],
                    reduction_config=None)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    g = torch.Generator().manual_seed(1)
    weights, grads, losses = {}, {}, {}
    hook.set_mode(modes.TRAIN)
    for step in range(6):
        x, y = torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)
        weights[step] = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        grads[step] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        losses[("train", step)] = loss.detach().clone()
        opt.step()
    hook.set_mode(modes.EVAL)
    with torch.no_grad():
        for step in range(2):
            x, y = torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)
            losses[("eval", step)] = loss_fn(model(x), y).clone()
    hook.close()

    with create_trial(collector.address, "roundtrip") as trial:
        assert trial.steps(mode=modes.TRAIN) == [0, 2, 4]
        assert trial.steps(mode=modes.EVAL) == [0, 1]
        assert trial.steps() == [0, 2, 4, 6, 7]
        assert trial.tensor_names(collection="losses") == ["CrossEntropyLoss_output_0"]
        assert sorted(trial.tensor_names(collection="gradients")) == sorted(
            "gradient/Sequential_" + n for n, _ in model.named_parameters())
        for step in (0, 2, 4):
            for name in weights[step]:
                w = trial.tensor("Sequential_" + name).value(step, mode=modes.TRAIN)
                assert w.dtype == np.float32 and w.shape == tuple(weights[step][name].shape)
                assert w.tobytes() == weights[step][name].numpy().tobytes()
                gr = trial.tensor("gradient/Sequential_" + name).value(step, mode=modes.TRAIN)
                assert gr.tobytes() == grads[step][name].numpy().tobytes()
                # A reduction answers from the same values.
                l2 = trial.tensor("gradient/Sequential_" + name).reduction_value(
                    step, "l2", mode=modes.TRAIN)
                assert np.isclose(l2, float(grads[step][name].double().norm()), rtol=1e-6)
        loss = trial.tensor("CrossEntropyLoss_output_0")
        train_losses = loss.values(mode=modes.TRAIN)
        assert sorted(train_losses) == [0, 2, 4]
        for step, v in train_losses.items():
            assert v.tobytes() == losses[("train", step)].numpy().tobytes()
        for step in (0, 1):
            assert (loss.value(step, mode=modes.EVAL).tobytes() ==
                    losses[("eval", step)].numpy().tobytes())
        # Global step 6 is EVAL step 0: the same value either way.
        assert loss.value(6).tobytes() == loss.value(0, mode=modes.EVAL).tobytes()
        assert trial.workers() == [0]


def test_a_trial_on_a_running_job_sees_new_steps_as_they_arrive(collector):
    model = make_model()
    loss_fn = nn.MSELoss()
    hook = smd.Hook(collector=collector.address, job="live", strict=True,
                    save_config=smd.SaveConfig(save_interval=1))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    assert hook.wait_until_connected(10)
    go = threading.Event()
    stop = threading.Event()
    produced = []

    def train():
        for step in range(100000):
            if stop.is_set():
                break
            if step == 3:
                go.wait(30)  # the trial looks while training is between steps
            loss_fn(model(torch.randn(2, 6)), torch.zeros(2, 3))
            produced.append(step)
            hook.flush(10)
        hook.close()

    worker = threading.Thread(target=train)
    worker.start()
    try:
        with create_trial(collector.address, "live") as trial:
            trial.wait_for_steps([1], mode=modes.GLOBAL, timeout=30)
            assert trial.has_passed_step(1) == StepState.AVAILABLE
            assert trial.has_passed_step(50) == StepState.NOT_YET_AVAILABLE
            go.set()
            trial.wait_for_steps([50], timeout=60)  # arrives while the job runs
            assert trial.has_passed_step(50) == StepState.AVAILABLE
            assert not trial.training_ended()
            value = trial.tensor("MSELoss_output_0").value(50)
            assert value.shape == () and np.isfinite(value)
    finally:
        stop.set()
        go.set()
        worker.join(60)
    assert len(produced) > 50
