"""Reference XXH64 outputs for headcount-core's byte-key hash.

Run with the `xxhash` package from PyPI, which wraps the reference C library (xxHash 0.8.x):

    python3 -m venv /tmp/xxv && /tmp/xxv/bin/pip install xxhash
    /tmp/xxv/bin/python xxh64.py > xxh64.txt

Output lines: `xxh64 <hex input> <hash as 16 hex digits>`, all with seed 0. The input is empty
as `-`. Inputs cover every length from 0 to 100 bytes (so every tail path of the algorithm and
several 32-byte stripes), a few text keys, and the little-endian bytes of some u64 IDs.
"""

import struct

import xxhash


def emit(data: bytes) -> None:
    shown = data.hex() if data else "-"
    print(f"xxh64 {shown} {xxhash.xxh64_intdigest(data, seed=0):016x}")


pattern = bytes((i * 7 + 3) & 0xFF for i in range(100))
for n in range(101):
    emit(pattern[:n])
for text in ["a", "abc", "hc:{orders}:slot:0", "task-42", "héllo wörld", "x" * 1000]:
    emit(text.encode("utf-8"))
for value in [0, 1, 2, 42, 0xDEAD10CC, 2**63, 2**64 - 1]:
    emit(struct.pack("<Q", value))
