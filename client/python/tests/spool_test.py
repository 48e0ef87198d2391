"""The durable spool from PyTorch: steps a collector never acknowledged
outlive the training process (a collector down for the whole run, kill -9)
and are stored exactly once later, by the next hook started with the same
spool directory (`sonde sync` does the same from the shell:
tests/spool_test.cc)."""

import os
import signal
import socket
import subprocess
import sys
import textwrap

import numpy as np
import torch
import torch.nn as nn

import sonde.torch as smd
from sonde.testing import Collector
from sonde.trials import create_trial
from sonde_pytest import wait_until

STEPS = 6


def free_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "127.0.0.1:%d" % s.getsockname()[1]


def train(hook, steps, seed=0):
    """Trains a small model `steps` steps (with `hook` registered, if one);
    its first weight at each step."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    loss_fn = nn.CrossEntropyLoss()
    if hook is not None:
        hook.register_module(model)
        hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(seed)
    weights = []
    for _ in range(steps):
        weights.append(model[0].weight.detach().clone().numpy())
        opt.zero_grad()
        loss_fn(model(torch.randn(8, 4, generator=g)), torch.randint(0, 2, (8,), generator=g)).backward()
        opt.step()
    return weights


def hook_for(address, job, spool_dir, **kwargs):
    return smd.Hook(collector=address, job=job, spool_dir=spool_dir,
                    save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "losses"], **kwargs)


def upload_by_the_next_hook(address, spool_dir):
    """A new run with the same spool uploads what the earlier one left
    (in the background, from its first step on)."""
    hook = hook_for(address, "next-run", spool_dir, strict=True)
    train(hook, 1)
    wait_until(lambda: hook.counters()["left_spools_uploaded"] >= 1)
    counters = hook.counters()
    hook.close()
    return counters


def test_a_collector_down_for_the_whole_run_loses_no_step(tmp_path):
    address, spool_dir = free_address(), str(tmp_path / "spool")
    hook = hook_for(address, "down", spool_dir, close_timeout_seconds=1)
    weights = train(hook, STEPS)
    hook.close()  # times out: logged, not raised (strict=False)
    c = hook.counters()
    assert c["steps_left_in_spool"] == STEPS, c
    assert c["tensors_dropped"] == 0 and c["steps_dropped"] == 0, c

    with Collector(listen=address) as collector:
        uploaded = upload_by_the_next_hook(collector.address, spool_dir)
        assert uploaded["left_spools_uploaded"] == 1
        assert uploaded["left_steps_uploaded"] == STEPS
        trial = create_trial(collector.address, "down")
        name = "Sequential_0.weight"
        assert trial.tensor(name).steps() == list(range(STEPS))
        for step in range(STEPS):
            np.testing.assert_array_equal(trial.tensor(name).value(step), weights[step])
    assert not [f for _, _, files in os.walk(spool_dir) for f in files if f.endswith(".seg")]


KILLED = textwrap.dedent("""
    import os, signal, sys
    sys.path[:0] = %r
    import torch
    import sonde.torch as smd
    from spool_test import hook_for, train
    from sonde_pytest import wait_until
    hook = hook_for(sys.argv[1], "killed", sys.argv[2])
    train(hook, %d)  # its last step stays open: it ends when a next one begins
    wait_until(lambda: hook.counters()["entries_spooled"] >= %d, timeout=60)
    print("spooled", hook.counters()["entries_spooled"], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_kill_9_of_a_training_process_loses_only_its_open_step(tmp_path):
    address, spool_dir = free_address(), str(tmp_path / "spool")
    here = os.path.dirname(os.path.abspath(__file__))
    script = KILLED % (sys.path + [here], STEPS, STEPS - 1)
    proc = subprocess.run([sys.executable, "-c", script, address, spool_dir],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert proc.stdout.startswith("spooled"), proc.stdout + proc.stderr[-3000:]

    with Collector(listen=address) as collector:
        uploaded = upload_by_the_next_hook(collector.address, spool_dir)
        trial = create_trial(collector.address, "killed")
        steps = trial.tensor("Sequential_0.weight").steps()
        # Every step that ended (the last one was still open) is stored,
        # once: the upload's count is the steps stored.
        assert steps == list(range(STEPS - 1)), steps
        assert uploaded["left_steps_uploaded"] == STEPS - 1
        weights = train(None, STEPS)  # the same training, without Sonde
        for step in steps:
            np.testing.assert_array_equal(trial.tensor("Sequential_0.weight").value(step),
                                          weights[step])
