#!/usr/bin/env python3
"""The checksum of gpufs-producer / gpufs-consumer (common.cuh), on the host.

  gpufs_checksum.py FILE                 # checksum of FILE's bytes (e.g. via the mount)
  gpufs_checksum.py --pattern SIZE SEED  # checksum of what `gpufs-producer PATH SIZE SEED` writes
  gpufs_checksum.py FILE --expect-seed SEED   # also check every byte against the pattern

Prints "size=N checksum=0x..." (and "verify=ok" / "verify=FAILED ..."), exit 0
when all checks pass. Uses numpy when present, plain Python otherwise (slow).

Checksum: with w_k the little-endian 64-bit word of bytes [8k, 8k+8) (the last
zero-padded), sum over k of w_k * (2k + 1) mod 2^64.
Pattern: byte i = low byte of splitmix64(i + SEED * 0x9E3779B97F4A7C15).
"""
import argparse
import sys

M = (1 << 64) - 1
CHUNK = 1 << 24  # a multiple of 8

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None


def _pattern_py(start, n, seed):
    out = bytearray(n)
    for j in range(n):
        z = (start + j + seed * 0x9E3779B97F4A7C15) & M
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        z ^= z >> 31
        out[j] = z & 0xFF
    return bytes(out)


def _pattern_np(start, n, seed):
    with np.errstate(over="ignore"):
        z = np.arange(start, start + n, dtype=np.uint64)
        z += np.uint64((seed * 0x9E3779B97F4A7C15) & M)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
        return (z & np.uint64(0xFF)).astype(np.uint8).tobytes()


def pattern(start, n, seed):
    return _pattern_np(start, n, seed) if np is not None else _pattern_py(start, n, seed)


def _sum_chunk(data, first_word):
    """Weighted sum of `data` (length a multiple of 8, or the zero-padded tail)."""
    if len(data) % 8:
        data = data + bytes(8 - len(data) % 8)
    if np is not None:
        with np.errstate(over="ignore"):
            w = np.frombuffer(data, dtype="<u8")
            k = np.arange(first_word, first_word + len(w), dtype=np.uint64)
            return int(np.sum(w * (np.uint64(2) * k + np.uint64(1)), dtype=np.uint64))
    total = 0
    for j in range(0, len(data), 8):
        k = first_word + j // 8
        total = (total + int.from_bytes(data[j:j + 8], "little") * (2 * k + 1)) & M
    return total


def checksum_chunks(chunks):
    total, size = 0, 0
    for data in chunks:
        assert size % 8 == 0, "only the last chunk may be short"
        total = (total + _sum_chunk(data, size // 8)) & M
        size += len(data)
    return size, total


def file_chunks(path):
    with open(path, "rb") as f:
        while True:
            data = f.read(CHUNK)
            if not data:
                return
            while len(data) % 8:  # short read: top up to a word boundary
                more = f.read(CHUNK - len(data))
                if not more:
                    break
                data += more
            yield data


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", nargs="?")
    ap.add_argument("--pattern", nargs=2, metavar=("SIZE", "SEED"))
    ap.add_argument("--expect-seed", type=lambda s: int(s, 0))
    a = ap.parse_args()
    if (a.file is None) == (a.pattern is None):
        ap.error("give FILE or --pattern SIZE SEED")

    if a.pattern:
        size, seed = int(a.pattern[0], 0), int(a.pattern[1], 0)
        chunks = (pattern(o, min(CHUNK, size - o), seed) for o in range(0, size, CHUNK))
        size, total = checksum_chunks(chunks)
        print(f"size={size} checksum=0x{total:016x}")
        return 0

    bad, first = 0, None
    offset = 0

    def checked():
        nonlocal bad, first, offset
        for data in file_chunks(a.file):
            if a.expect_seed is not None:
                want = pattern(offset, len(data), a.expect_seed)
                if data != want:
                    diffs = [j for j in range(len(data)) if data[j] != want[j]]
                    bad += len(diffs)
                    if first is None:
                        first = offset + diffs[0]
            offset += len(data)
            yield data

    size, total = checksum_chunks(checked())
    print(f"size={size} checksum=0x{total:016x}")
    if a.expect_seed is not None:
        print("verify=ok" if bad == 0 else f"verify=FAILED mismatches={bad} first_mismatch={first}")
        return 0 if bad == 0 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
