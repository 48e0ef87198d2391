"""Two real training processes (torch.distributed, gloo, DDP) on one job.

The rank and world size come from torch.distributed; include_workers decides
who saves, as in smdebug.
"""

import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import sonde.torch as smd
from sonde import modes
from sonde.trials import create_trial


def _rank_main(rank, world_size, init_file, address, job, include_workers, steps):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world_size)
    torch.manual_seed(0)  # same initial weights on every rank
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    hook = smd.Hook(collector=address, job=job, strict=True, include_workers=include_workers,
                    save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients", "losses"])
    assert hook.worker == rank and hook.world_size == world_size
    loss_fn = nn.MSELoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    hook.set_mode(modes.TRAIN)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    for _ in range(steps):
        x = torch.randn(8, 3, generator=g)
        opt.zero_grad()
        loss_fn(ddp(x), x.sum(1, keepdim=True)).backward()
        opt.step()
    hook.close()
    dist.destroy_process_group()


def _run(address, job, include_workers, tmp_path, steps=4):
    init_file = str(tmp_path / ("init-" + job))
    mp.start_processes(_rank_main, args=(2, init_file, address, job, include_workers, steps),
                       nprocs=2, join=True, start_method="spawn")


def test_every_worker_saves_with_include_workers_all(collector, tmp_path):
    _run(collector.address, "ddp-all", "all", tmp_path)
    with create_trial(collector.address, "ddp-all") as trial:
        assert trial.workers() == [0, 1]
        assert trial.steps(mode=modes.TRAIN) == [0, 1, 2, 3]
        w = trial.tensor("Sequential_0.weight")
        loss = trial.tensor("MSELoss_output_0")
        for step in range(4):
            # DDP keeps the replicas equal: both workers saved the same weights...
            w0 = w.value(step, mode=modes.TRAIN, worker=0)
            w1 = w.value(step, mode=modes.TRAIN, worker=1)
            assert w0.tobytes() == w1.tobytes()
            # ...while each saw its own data, so the losses differ.
            l0 = loss.value(step, mode=modes.TRAIN, worker=0)
            l1 = loss.value(step, mode=modes.TRAIN, worker=1)
            assert np.isfinite(l0) and np.isfinite(l1) and l0 != l1
        assert w.value(0, mode=modes.TRAIN, worker=0).tobytes() != \
            w.value(3, mode=modes.TRAIN, worker=0).tobytes()


def test_only_rank_zero_saves_with_include_workers_one(collector, tmp_path):
    _run(collector.address, "ddp-one", "one", tmp_path)
    with create_trial(collector.address, "ddp-one") as trial:
        assert trial.workers() == [0]
        assert trial.steps(mode=modes.TRAIN) == [0, 1, 2, 3]


if __name__ == "__main__":
    sys.exit("run through pytest")
