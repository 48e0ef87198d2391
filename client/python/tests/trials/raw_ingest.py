"""A training worker written by hand for the sonde.trials tests.

`Worker` speaks the Collector.Stream protocol through the sonde.v1 stubs
(hello, tensor chunks and summaries, step ends, job end; every message
numbered, every payload with its CRC-32C), so a test controls every byte
the collector stores and can compare what sonde.trials reads back bit for
bit. Each step_end waits for the collector's ack: when it returns, the
step is committed and every query sees it.

The CRC-32C here is built from the definition (bit-reflected polynomial
0x82F63B78, initial and final XOR 0xFFFFFFFF), independent of the one in
sonde.trials, so the two check each other.
"""

import math
import queue
import random

import grpc
import numpy as np

from sonde.v1 import collector_pb2, collector_pb2_grpc, query_pb2, query_pb2_grpc, rule_pb2
from sonde.v1 import tensor_pb2

GLOBAL = tensor_pb2.MODE_GLOBAL


def _crc_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in bytes(data):
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


WIRE_DTYPE = {
    np.dtype(np.float32): tensor_pb2.DTYPE_F32,
    np.dtype(np.float64): tensor_pb2.DTYPE_F64,
    np.dtype(np.float16): tensor_pb2.DTYPE_F16,
    np.dtype(np.int8): tensor_pb2.DTYPE_I8,
    np.dtype(np.int16): tensor_pb2.DTYPE_I16,
    np.dtype(np.int32): tensor_pb2.DTYPE_I32,
    np.dtype(np.int64): tensor_pb2.DTYPE_I64,
    np.dtype(np.uint8): tensor_pb2.DTYPE_U8,
    np.dtype(np.bool_): tensor_pb2.DTYPE_BOOL,
}


def bf16_bytes(values):
    """bfloat16 bytes of float32 values (their upper halves: exact for
    values that are bfloat16 already)."""
    bits = np.asarray(values, dtype="<f4").view("<u4")
    return (bits >> 16).astype("<u2").tobytes()


def statistics_of(array):
    """Statistics as proto/tensor.proto defines them, computed in float64."""
    x = np.asarray(array, dtype=np.float64).ravel()
    nan = np.isnan(x)
    finite = x[np.isfinite(x)]
    s = tensor_pb2.Statistics(
        count=x.size, finite_count=finite.size, nan_count=int(nan.sum()),
        pos_inf_count=int(np.isposinf(x).sum()), neg_inf_count=int(np.isneginf(x).sum()),
        zero_count=int((finite == 0).sum()))
    if x.size > s.nan_count:
        not_nan = x[~nan]
        s.min, s.max = float(not_nan.min()), float(not_nan.max())
        s.abs_min, s.abs_max = float(np.abs(not_nan).min()), float(np.abs(not_nan).max())
    if finite.size:
        s.sum = math.fsum(finite)
        s.l1 = math.fsum(np.abs(finite))
        s.sum_squares = math.fsum(finite * finite)
        s.mean = s.sum / finite.size
        s.m2 = math.fsum((finite - s.mean) ** 2)
        s.variance = s.m2 / finite.size
        s.std = math.sqrt(s.variance)
        s.l2 = math.sqrt(s.sum_squares)
    return s


class IngestError(Exception):
    pass


class Worker:
    """One worker's ingest stream (rank `worker` of `world_size`)."""

    def __init__(self, address, job, worker=0, world_size=1, rules=(), token=None):
        self.job = job
        self.worker = worker
        self.actions = []
        self._seq = 0
        self._requests = queue.Queue()
        self._channel = grpc.insecure_channel(address)
        metadata = (("authorization", "Bearer " + token),) if token else ()
        self._responses = collector_pb2_grpc.CollectorStub(self._channel).Stream(
            iter(self._requests.get, None), metadata=metadata, timeout=120)
        self._send(hello=collector_pb2.Hello(
            job=job, worker=worker, world_size=world_size, client_version="trials-test",
            rules=list(rules), client_id=random.getrandbits(63) + 1))
        self.max_chunk_bytes = self._expect("hello_ack").max_chunk_bytes
        self._open = {}  # tensors sent in the open step

    def _send(self, **kind):
        self._seq += 1
        self._requests.put(collector_pb2.ClientMessage(seq=self._seq, **kind))

    def _expect(self, kind):
        for message in self._responses:
            which = message.WhichOneof("kind")
            if which == "action":
                self.actions.append(message.action)
            elif which == kind:
                return getattr(message, kind)
        raise IngestError("the stream ended before a {}".format(kind))

    def tensor(self, step, name, array, mode=GLOBAL, mode_step=None, collections=(),
               chunk_bytes=None, dtype=None, payload=None):
        """Sends an array (or raw `payload` bytes of wire `dtype`) as chunks."""
        array = np.asarray(array)
        if payload is None:
            payload = array.astype(array.dtype.newbyteorder("<")).tobytes()
        data = payload
        wire = dtype if dtype is not None else WIRE_DTYPE[array.dtype]
        size = chunk_bytes or self.max_chunk_bytes
        pieces = [data[i:i + size] for i in range(0, len(data), size)] or [b""]
        for index, piece in enumerate(pieces):
            self._send(chunk=tensor_pb2.TensorChunk(
                step=step, mode=mode, mode_step=step if mode_step is None else mode_step,
                tensor_name=name, collections=list(collections), dtype=wire,
                shape=list(array.shape), chunk_index=index, chunk_count=len(pieces),
                byte_offset=index * size, total_bytes=len(data), payload=piece,
                crc32c=crc32c(piece)))
        self._open[name] = step

    def summary(self, step, name, array, mode=GLOBAL, mode_step=None, collections=(),
                dtype=None):
        """Sends only the statistics of an array (smdebug's reductions)."""
        array = np.asarray(array)
        self._send(summary=tensor_pb2.TensorSummary(
            step=step, mode=mode, mode_step=step if mode_step is None else mode_step,
            tensor_name=name, collections=list(collections),
            dtype=dtype if dtype is not None else WIRE_DTYPE[array.dtype],
            shape=list(array.shape), statistics=statistics_of(array)))
        self._open[name] = step

    def end_step(self, step, mode=GLOBAL, mode_step=None):
        """Ends the step and waits until the collector has committed it."""
        self._send(step_end=collector_pb2.StepEnd(
            step=step, mode=mode, mode_step=step if mode_step is None else mode_step,
            duration_seconds=0.01, tensor_count=len(self._open)))
        self._open = {}
        ack = self._expect("ack")
        if ack.acked_seq != self._seq:
            raise IngestError("ack of seq {}, sent {}".format(ack.acked_seq, self._seq))
        return ack

    def step(self, step, tensors, mode=GLOBAL, mode_step=None, collections=()):
        """One whole step of {name: array}."""
        for name, array in tensors.items():
            self.tensor(step, name, array, mode=mode, mode_step=mode_step,
                        collections=collections)
        return self.end_step(step, mode=mode, mode_step=mode_step)

    def end_job(self, reason="finished"):
        self._send(job_end=collector_pb2.JobEnd(reason=reason))
        self._expect("ack")
        self.close()

    def close(self):
        self._requests.put(None)
        self._channel.close()


def wait_for_rule_verdicts(address, job, timeout=60):
    """Follows WatchRuleResults until no rule of the job is InProgress."""
    with grpc.insecure_channel(address) as channel:
        stub = query_pb2_grpc.QueryStub(channel)
        latest = {r.rule: r for r in stub.GetRuleResults(
            query_pb2.GetRuleResultsRequest(job=job), timeout=timeout).results}

        def settled():
            return latest and all(r.status != rule_pb2.RULE_STATUS_IN_PROGRESS
                                  for r in latest.values())

        if not settled():
            stream = stub.WatchRuleResults(query_pb2.GetRuleResultsRequest(job=job),
                                           timeout=timeout)
            for r in stream:
                latest[r.rule] = r
                if settled():
                    stream.cancel()
                    break
        return latest
