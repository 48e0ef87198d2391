"""Tensor values read back from ReadTensor chunks: reassembled and checked
as the collector checks them on ingest (chunk order, offsets, sizes,
CRC-32C of every payload), then decoded into numpy arrays with the dtype and
shape that were saved.

dtypes: F32, F64, F16, I8, I16, I32, I64 and U8 map to numpy's (native byte
order); BOOL to numpy bool. BF16 has no numpy dtype: it is widened to
float32, which is exact (a bfloat16 is the upper half of a float32: NaN
payloads, infinities and -0.0 keep their bits).
"""

import numpy as np

from sonde.exceptions import TensorDataLoss
from sonde.trials.crc32c import crc32c
from sonde.v1 import tensor_pb2

_NUMPY = {
    tensor_pb2.DTYPE_F32: np.dtype("<f4"),
    tensor_pb2.DTYPE_F64: np.dtype("<f8"),
    tensor_pb2.DTYPE_F16: np.dtype("<f2"),
    tensor_pb2.DTYPE_I8: np.dtype("i1"),
    tensor_pb2.DTYPE_I16: np.dtype("<i2"),
    tensor_pb2.DTYPE_I32: np.dtype("<i4"),
    tensor_pb2.DTYPE_I64: np.dtype("<i8"),
    tensor_pb2.DTYPE_U8: np.dtype("u1"),
    tensor_pb2.DTYPE_BOOL: np.dtype("u1"),
    tensor_pb2.DTYPE_BF16: np.dtype("<u2"),
}


def element_size(dtype):
    wire = _NUMPY.get(dtype)
    return 0 if wire is None else wire.itemsize


def _describe(chunk):
    return "chunk {} of tensor '{}' at step {}".format(
        chunk.chunk_index, chunk.tensor_name, chunk.step)


def assemble(chunks, verify_crc=True):
    """(header chunk, bytearray of the values) from one ReadTensor stream.

    None when the stream carried no chunk at all.
    """
    header = None
    data = None
    offset = 0
    index = 0
    for chunk in chunks:
        where = _describe(chunk)
        if header is None:
            header = chunk
            size = element_size(chunk.dtype)
            if size == 0:
                raise TensorDataLoss("{}: unsupported dtype {}".format(where, chunk.dtype))
            count = int(np.prod(chunk.shape, dtype=np.int64)) if len(chunk.shape) else 1
            if count * size != chunk.total_bytes:
                raise TensorDataLoss("{}: {} tensor of shape {} needs {} bytes, total_bytes says {}"
                                     .format(where, tensor_pb2.DType.Name(chunk.dtype),
                                             list(chunk.shape), count * size, chunk.total_bytes))
            data = bytearray(chunk.total_bytes)
        if chunk.chunk_index != index or chunk.chunk_count != header.chunk_count:
            raise TensorDataLoss("{}: expected chunk {} of {}".format(
                where, index, header.chunk_count))
        index += 1
        payload = chunk.payload
        if chunk.byte_offset != offset:
            raise TensorDataLoss("{}: expected byte_offset {}, got {}".format(
                where, offset, chunk.byte_offset))
        if offset + len(payload) > len(data):
            raise TensorDataLoss("{}: payload runs past total_bytes {}".format(where, len(data)))
        if verify_crc:
            crc = crc32c(payload)
            if crc != chunk.crc32c:
                raise TensorDataLoss("{}: crc32c mismatch (computed {}, sent {})".format(
                    where, crc, chunk.crc32c))
        data[offset:offset + len(payload)] = payload
        offset += len(payload)
    if header is None:
        return None
    if offset != len(data) or index != header.chunk_count:
        raise TensorDataLoss("tensor '{}' at step {} arrived with {} of {} bytes in {} of {} chunks"
                             .format(header.tensor_name, header.step, offset, len(data), index,
                                     header.chunk_count))
    return header, data


def decode(data, dtype, shape):
    """A numpy array of the given wire dtype and shape over little-endian bytes."""
    wire = _NUMPY.get(dtype)
    if wire is None:
        raise TensorDataLoss("unsupported dtype {}".format(dtype))
    raw = np.frombuffer(data, dtype=wire)
    if dtype == tensor_pb2.DTYPE_BF16:
        array = (raw.astype(np.uint32) << 16).view(np.float32)
    elif dtype == tensor_pb2.DTYPE_BOOL:
        array = raw != 0
    else:
        array = raw.astype(wire.newbyteorder("="), copy=False)
    return array.reshape(tuple(shape))
