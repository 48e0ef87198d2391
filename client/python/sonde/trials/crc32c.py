"""CRC-32C (Castagnoli), as the collector puts on every chunk it sends.

The C++ implementation the collector and the hook use (common/crc32c.h),
through the extension: one implementation, cross-checked against the
bytewise definition in tests/trials/reading_test.py.
"""

from sonde import _sonde


def crc32c(data):
    """CRC-32C of a contiguous bytes-like object (bytes, bytearray,
    memoryview, numpy array), as an int."""
    return _sonde.crc32c(data)
