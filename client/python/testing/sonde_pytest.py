"""pytest plugin for Sonde's Python tests (loaded by run_pytest.sh).

Fixtures:
  collector: a real `sonde-collector` process from the runfiles, on a free
      loopback port and a fresh data directory; `collector.address`,
      `collector.restart()`, `collector.stop()`.
  start_collector: a factory, start_collector(rules="...", args=[...]), for
      tests that need several collectors or particular flags.
"""

import os
import signal
import subprocess
import threading

import pytest


def runfile(path):
    """Absolute path of a workspace-relative runfile."""
    root = os.environ.get("SONDE_RUNFILES") or os.getcwd()
    return os.path.join(root, path)


class Collector:
    """A sonde-collector process; the address is the first line it prints."""

    def __init__(self, data_dir, rules="", args=(), listen="127.0.0.1:0"):
        self.data_dir = str(data_dir)
        self.rules = rules
        self.args = list(args)
        self.proc = None
        self.address = None
        self.log = []
        self._start(listen)

    def _start(self, listen):
        cmd = [runfile("server/sonde-collector"), "--listen=" + listen,
               "--data_dir=" + self.data_dir, "--rules=" + self.rules] + self.args
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline().strip()
        if not line:
            err = self.proc.stderr.read()
            raise RuntimeError("sonde-collector did not start: " + err[-4000:])
        self.address = line.split()[-1]
        # Keep draining both pipes so the collector never blocks on a full pipe.
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._drain, args=(stream,), daemon=True).start()

    def _drain(self, stream):
        for line in stream:
            self.log.append(line)

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode if self.proc else None
        self.proc = None
        return rc

    def restart(self, in_place=True):
        """Stops and starts on the same data (and, in place, the same address)."""
        address = self.address
        self.stop()
        self._start(address if in_place else "127.0.0.1:0")


@pytest.fixture
def start_collector(tmp_path):
    started = []

    def start(rules="", args=(), name=None):
        c = Collector(tmp_path / (name or "db%d" % len(started)), rules=rules, args=args)
        started.append(c)
        return c

    yield start
    for c in started:
        c.stop()


@pytest.fixture
def collector(start_collector):
    return start_collector()
