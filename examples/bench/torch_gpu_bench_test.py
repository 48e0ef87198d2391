"""torch_gpu_bench.py runs end to end on the CPU path with a small MLP:
every copy trains, every hooked copy's saved steps are stored and complete,
the drop counters agree with the collector, and the values stored at the
verification step equal the model's (its times mean nothing)."""

import os
import subprocess

from sonde_pytest import runfile


def test_the_gpu_benchmark_runs_and_checks_on_the_cpu():
    env = dict(os.environ)
    p = subprocess.run(
        ["/usr/bin/python3", runfile("examples/bench/torch_gpu_bench.py"), "--device", "cpu",
         "--width", "128", "--layers", "3", "--batch", "32", "--rounds", "2", "--steps", "10",
         "--modes", "stats,stats_deferred,values100,values10",
         "--collector_binary", runfile("server/sonde-collector")],
        capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "checks passed" in p.stdout, p.stdout
    rows = {line.split()[0]: line.split() for line in p.stdout.splitlines()
            if line.split() and line.split()[0] in ("none", "stats", "stats_deferred",
                                                    "values100", "values10")}
    assert set(rows) == {"none", "stats", "stats_deferred", "values100", "values10"}, p.stdout
    # values10 over 3 rounds of 10 steps (the first a warm-up): steps 0..29,
    # saved at 0, 10, 20, then the verification step 30: all complete, and
    # the 6 weights and 6 gradients stored there equal the model's. values100
    # runs on untimed to its verification step 100.
    assert rows["values10"][-3:] == ["4", "4", "12/12"], p.stdout
    assert rows["values100"][-3:] == ["2", "2", "12/12"], p.stdout
    assert rows["stats"][-3:] == ["30", "30", "-"], p.stdout
    assert rows["stats_deferred"][-3:] == ["30", "30", "-"], p.stdout
    assert rows["stats"][7] == "0/0", p.stdout
    assert rows["values10"][8] == "0", p.stdout  # no device values to spill on the CPU
    # Where the hooks' time went: every hooked copy spent some in Sonde's
    # hooks; on the CPU path none in device enqueues.
    lines = p.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("host time a timed step"))
    host = {}
    for line in lines[first + 2:]:
        if not line.strip():
            break
        host[line.split()[0]] = [float(v) for v in line.split()[1:]]
    assert set(host) == {"stats", "stats_deferred", "values100", "values10"}, p.stdout
    for name, (hook, enqueue, engine, handover) in host.items():
        assert hook > 0, p.stdout
        assert enqueue == engine == handover == 0, p.stdout
