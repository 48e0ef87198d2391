"""A local sonde-collector process, for tests, examples and benchmarks.

  from sonde.testing import Collector
  with Collector() as collector:          # a free loopback port, a temporary directory
      hook = smd.Hook(collector=collector.address, job="try")
      ...

The pytest plugin client/python/testing/sonde_pytest.py builds its fixtures
on it; examples/pytorch_digits.py --embedded and the benchmarks in
examples/bench use it directly.
"""

import os
import shutil
import signal
import subprocess
import tempfile
import threading

from sonde.collector import shipped_path


def find_collector_binary():
    """$SONDE_COLLECTOR_BINARY, the one an installed wheel ships
    (sonde/bin), the runfiles' collector, or bazel-bin's."""
    candidates = [os.environ.get("SONDE_COLLECTOR_BINARY"), shipped_path("sonde-collector")]
    for root in (os.environ.get("SONDE_RUNFILES"), os.environ.get("RUNFILES_DIR")):
        if root:
            candidates.append(os.path.join(root, "server/sonde-collector"))
            candidates.append(os.path.join(root, "sonde/server/sonde-collector"))
    # This file is client/python/sonde/testing.py in the workspace.
    workspace = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
    candidates.append(os.path.join(workspace, "bazel-bin", "server", "sonde-collector"))
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError("no sonde-collector binary: build //server:sonde-collector or set "
                            "SONDE_COLLECTOR_BINARY")


class Collector:
    """A sonde-collector process; the address is the first line it prints.

    data_dir: where it stores (default: a temporary directory, removed by
    stop()). binary: default find_collector_binary(). Its output is kept in
    `log` (lines), read continuously so it never blocks on a full pipe.
    """

    def __init__(self, data_dir=None, rules="", args=(), listen="127.0.0.1:0", binary=None):
        self._tmp = None
        if data_dir is None:
            self._tmp = tempfile.mkdtemp(prefix="sonde-collector-")
            data_dir = os.path.join(self._tmp, "db")
        self.data_dir = str(data_dir)
        self.binary = binary or find_collector_binary()
        self.rules = rules
        self.args = list(args)
        self.proc = None
        self.address = None
        self.log = []
        try:
            self._start(listen)
        except BaseException:
            self._remove_tmp()
            raise

    def _start(self, listen):
        cmd = [self.binary, "--listen=" + listen, "--data_dir=" + self.data_dir,
               "--rules=" + self.rules] + self.args
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline().strip()
        if not line:
            err = self.proc.stderr.read()
            self.proc.wait()
            raise RuntimeError("sonde-collector did not start: " + err[-4000:])
        self.address = line.split()[-1]
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._drain, args=(stream,), daemon=True).start()

    def _drain(self, stream):
        for line in stream:
            self.log.append(line)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Stops the process (killed if it has not exited after `timeout`
        seconds) and removes a temporary data directory. The exit code."""
        try:
            return self._stop_process(sig, timeout)
        finally:
            self._remove_tmp()

    def _stop_process(self, sig=signal.SIGTERM, timeout=60):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode if self.proc else None
        self.proc = None
        return rc

    def _remove_tmp(self):
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def restart(self, in_place=True):
        """Stops and starts on the same data (and, in place, the same address)."""
        address = self.address
        self._stop_process()
        self._start(address if in_place else "127.0.0.1:0")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False
