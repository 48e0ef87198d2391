"""Tensor values read back from ReadTensor chunks: reassembled and checked
by the collector's own code (common/tensor_chunks.h through the extension:
chunk order, offsets, sizes, CRC-32C of every payload), then decoded into numpy arrays with the dtype and
shape that were saved.

dtypes: F32, F64, F16, I8, I16, I32, I64 and U8 map to numpy's (native byte
order); BOOL to numpy bool. BF16 has no numpy dtype: it is widened to
float32, which is exact (a bfloat16 is the upper half of a float32: NaN
payloads, infinities and -0.0 keep their bits).
"""

import numpy as np

from sonde import _sonde
from sonde.exceptions import TensorDataLoss
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


# A reader takes what the collector sends: the collector limited sizes when
# the tensor was stored, and the channel limits each message.
_NO_LIMIT = (1 << 63) - 1


def assemble(chunks):
    """(header chunk, bytearray of the values) from one ReadTensor stream, with
    the checks the collector applies on ingest (its own code, through the
    extension). None when the stream carried no chunk at all."""
    assembler = _sonde.TensorAssembler(max_chunk_bytes=_NO_LIMIT, max_tensor_bytes=_NO_LIMIT)
    last = None
    for chunk in chunks:
        last = chunk
        refused = assembler.add(chunk.SerializeToString())
        if refused is not None:
            raise TensorDataLoss(refused[1])
    if last is None:
        return None
    header = tensor_pb2.TensorChunk.FromString(assembler.header())
    if not assembler.complete:
        raise TensorDataLoss("tensor '{}' at step {} arrived with {} of {} bytes in {} of {} chunks"
                             .format(header.tensor_name, header.step, assembler.bytes_received,
                                     header.total_bytes, assembler.chunks_received,
                                     header.chunk_count))
    if element_size(header.dtype) == 0:
        raise TensorDataLoss("tensor '{}' at step {}: unsupported dtype {}".format(
            header.tensor_name, header.step, header.dtype))
    return header, assembler.take_bytes()


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
