"""The pieces under a Trial, without a collector: CRC-32C, reassembly of
ReadTensor chunks (and its refusals), and reductions from statistics
agreeing with numpy on the values, NaN and infinities included."""

import math

import numpy as np
import pytest

from raw_ingest import crc32c as reference_crc32c
from raw_ingest import statistics_of
from sonde.trials import TensorDataLoss
from sonde.trials import reductions
from sonde.trials.crc32c import crc32c
from sonde.trials.values import assemble, decode
from sonde.v1 import tensor_pb2


def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC catalogue's check for CRC-32C
    assert crc32c(b"") == 0


@pytest.mark.parametrize("size", [1, 255, 4095, 4096, 4097, 65536 + 3, 1 << 20])
def test_crc32c_matches_the_bytewise_definition(size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    assert crc32c(data) == reference_crc32c(data)
    assert crc32c(memoryview(data)[1:]) == reference_crc32c(data[1:])


def chunks_of(array, wire_dtype, piece):
    data = array.tobytes()
    pieces = [data[i:i + piece] for i in range(0, len(data), piece)]
    return [tensor_pb2.TensorChunk(
        tensor_name="t", step=3, dtype=wire_dtype, shape=list(array.shape), chunk_index=i,
        chunk_count=len(pieces), byte_offset=i * piece, total_bytes=len(data), payload=p,
        crc32c=reference_crc32c(p)) for i, p in enumerate(pieces)]


def test_chunks_reassemble_into_the_array():
    array = np.arange(100, dtype="<i4").reshape(4, 25)
    header, data = assemble(chunks_of(array, tensor_pb2.DTYPE_I32, 64))
    value = decode(data, header.dtype, header.shape)
    assert value.dtype == np.int32 and value.shape == (4, 25)
    assert value.tobytes() == array.tobytes()


def test_values_read_back_are_a_writable_array():
    array = np.arange(6, dtype="<f4").reshape(2, 3)
    header, data = assemble(chunks_of(array, tensor_pb2.DTYPE_F32, 8))
    value = decode(data, header.dtype, header.shape)
    value[0, 0] = 7.0
    assert value[0, 0] == 7.0 and value[1, 2] == 5.0


def test_an_empty_tensor_is_one_empty_chunk():
    chunk = tensor_pb2.TensorChunk(tensor_name="e", step=1, dtype=tensor_pb2.DTYPE_F32,
                                   shape=[0, 3], chunk_count=1, crc32c=0)
    header, data = assemble([chunk])
    assert decode(data, header.dtype, header.shape).shape == (0, 3)
    assert assemble([]) is None


@pytest.mark.parametrize("damage, message", [
    (lambda c: c[1].__setattr__("crc32c", c[1].crc32c ^ 1), "crc32c mismatch"),
    (lambda c: c.pop(1), "expected chunk index 1 of 7"),
    (lambda c: c.pop(), "arrived with 384 of 400 bytes in 6 of 7 chunks"),
    (lambda c: c[2].__setattr__("byte_offset", 0), "expected byte_offset 128, got 0"),
    (lambda c: c[0].__setattr__("total_bytes", 4), "needs 400 bytes, total_bytes says 4"),
    (lambda c: c[3].__setattr__("tensor_name", "u"), "descriptive fields differ from chunk 0"),
    (lambda c: c.append(c[-1]), "tensor already complete"),
    (lambda c: c[0].__setattr__("dtype", 99), "dtype"),
])
def test_damaged_chunks_are_refused(damage, message):
    chunks = chunks_of(np.arange(100, dtype="<f4"), tensor_pb2.DTYPE_F32, 64)
    damage(chunks)
    with pytest.raises(TensorDataLoss, match=message):
        assemble(chunks)


ARRAYS = {
    "mixed signs": np.linspace(-3, 5, 101),
    "positive": np.linspace(0.5, 9, 50),
    "negative": -np.linspace(0.5, 9, 50),
    "with +inf": np.array([1.0, np.inf, -2.0]),
    "with -inf": np.array([1.0, -np.inf, -2.0]),
    "with both infinities": np.array([np.inf, -np.inf, 3.0]),
    "with nan": np.array([1.0, np.nan, -2.0]),
    "only nan": np.array([np.nan, np.nan]),
    "one element": np.array([-4.0]),
    "zeros": np.zeros(5),
}


@pytest.mark.parametrize("abs_", [False, True])
@pytest.mark.parametrize("name", reductions.FROM_STATISTICS)
@pytest.mark.parametrize("case", sorted(ARRAYS))
def test_statistics_answer_what_numpy_says_of_the_values(case, name, abs_):
    array = ARRAYS[case]
    with np.errstate(all="ignore"):
        expected = reductions.from_values(name, array, abs_)
    got = reductions.from_statistics(name, statistics_of(array), abs_)
    assert isinstance(got, np.float64)
    if math.isnan(expected) or math.isinf(expected):
        assert got == expected or (math.isnan(got) and math.isnan(expected))
    else:
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_statistics_cannot_give_a_product_and_empty_tensors_have_no_extremes():
    stats = statistics_of(np.array([2.0, 3.0]))
    assert reductions.from_statistics("prod", stats) is None
    empty = statistics_of(np.zeros(0))
    assert reductions.from_statistics("sum", empty) == 0.0
    assert math.isnan(reductions.from_statistics("mean", empty))
    with pytest.raises(ValueError, match="empty"):
        reductions.from_statistics("min", empty)
