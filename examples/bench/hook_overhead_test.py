"""hook_overhead.py runs end to end (one short window; the numbers of a
test run mean nothing, the table's shape does)."""

import os
import re
import subprocess

from sonde_pytest import runfile


def test_one_window_prints_a_ratio_per_save_interval():
    env = dict(os.environ)
    env["PYTHONPATH"] = runfile("examples") + ":" + env["PYTHONPATH"]
    p = subprocess.run(
        ["/usr/bin/python3", runfile("examples/bench/hook_overhead.py"), "--models", "digits",
         "--windows", "1", "--save_intervals", "0,100",
         "--collector_binary", runfile("server/sonde-collector")],
        capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.split() for line in p.stdout.splitlines() if line.startswith("digits  every")]
    assert [row[2] for row in rows] == ["0", "100"]
    for row in rows:
        assert re.fullmatch(r"x\d+\.\d{3}", row[4]), row  # wall ratio
        assert re.fullmatch(r"x\d+\.\d{3}", row[6]), row  # training-thread CPU ratio
