"""CRC-32C (Castagnoli), as the collector puts on every chunk it sends.

Python has no CRC-32C and Debian ships no module for it, so this one is
numpy-vectorized: the data is cut into equal blocks whose CRCs advance
together one byte column at a time, and the block CRCs are then chained
with a table that moves a CRC register across one block of zero bytes
(CRC is linear over GF(2): crc(r, A) = crc(r, zeros(len A)) ^ crc(0, A)).
About 50 MB/s on one core instead of ~5 MB/s byte by byte.
"""

import numpy as np

_POLY = 0x82F63B78  # Castagnoli, bit-reflected


def _byte_table():
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(_POLY), t >> 1).astype(np.uint32)
    return t


_TABLE = _byte_table()
_TABLE_LIST = _TABLE.tolist()
_SMALL = 4096  # below this many bytes the plain loop is faster
_zero_tables = {}  # block length -> 4 tables: register byte i through that many zero bytes


def _update(crc, data):
    table = _TABLE_LIST
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc


def _zero_table(length):
    tables = _zero_tables.get(length)
    if tables is None:
        shifts = (8 * np.arange(4, dtype=np.uint32))[:, None]
        regs = (np.arange(256, dtype=np.uint32)[None, :] << shifts).ravel()
        for _ in range(length):
            regs = _TABLE[regs & 0xFF] ^ (regs >> 8)
        tables = regs.reshape(4, 256).tolist()
        _zero_tables[length] = tables
    return tables


def crc32c(data):
    """CRC-32C of a bytes-like object, as an int."""
    view = memoryview(data).cast("B")
    n = len(view)
    if n < _SMALL:
        return _update(0xFFFFFFFF, view) ^ 0xFFFFFFFF
    block = 1 << max(8, n.bit_length() // 2)  # about sqrt(n) bytes per block
    blocks = n // block
    columns = np.ascontiguousarray(
        np.frombuffer(view, dtype=np.uint8, count=blocks * block).reshape(blocks, block).T)
    regs = np.zeros(blocks, dtype=np.uint32)
    for column in columns:
        regs = _TABLE[(regs ^ column) & 0xFF] ^ (regs >> 8)
    z0, z1, z2, z3 = _zero_table(block)
    crc = 0xFFFFFFFF
    for r in regs.tolist():
        crc = z0[crc & 0xFF] ^ z1[(crc >> 8) & 0xFF] ^ z2[(crc >> 16) & 0xFF] ^ z3[crc >> 24] ^ r
    return _update(crc, view[blocks * block:]) ^ 0xFFFFFFFF
