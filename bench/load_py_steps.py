#!/usr/bin/env python3
"""What gpufs.load of a mapped object spends in gpufs's own Python, with no
GPU and no mount: _objmap.to_torch's pass over the member table (dtype and
shape of each member, its offset in its allocation, the dict built) for the
llama layout of bench/torch_views_bench.py (201 bf16 members in one
allocation), with a stand-in torch whose calls return at once and a member
table filled as libgpufs's gpufs_map_object would fill it.

    python3 bench/load_py_steps.py [--runs 300]

torch's own cost of the views is what bench/torch_views_bench.py measures
on a GPU; this is what gpufs adds around it. Prints the median and the
quartiles of one to_torch, in ms.
"""
import argparse
import ctypes
import os
import statistics
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

from gpufs import _lib, _objmap  # noqa: E402
from torch_views_bench import layout  # noqa: E402

BASE = 0x7F0000000000


class _Device:
    def __init__(self, spec):
        self.type, _, index = str(spec).partition(":")
        self.index = int(index) if index else None

    def __eq__(self, other):
        return (self.type, self.index) == (other.type, other.index)


class _Tensor:
    device = _Device("cuda:0")

    def view(self, *_):
        return self


def stand_in_torch():
    one = _Tensor()
    return types.SimpleNamespace(as_tensor=lambda *_a, **_k: one, as_strided=lambda *_a: one,
                                 device=_Device, uint8=object(), bfloat16=object())


class TableMapping:
    """An ObjectMapping's answers (ranges(), the member table) without a map."""

    def __init__(self):
        shapes, numels, offsets, _, total = layout()
        self._keep = []
        table = (_lib.GpufsMemberMap * len(shapes))()
        for i, (shape, n, off) in enumerate(zip(shapes, numels, offsets)):
            m = table[i]
            name = f"model.layers.{i // 9}.member{i % 9}.weight".encode()
            dims = (ctypes.c_uint64 * len(shape))(*shape)
            self._keep += [name, dims]
            m.name, m.dtype, m.ptr, m.size = name, b"bfloat16", BASE + off * 2, n * 2
            m.shape, m.ndim = ctypes.cast(dims, ctypes.POINTER(ctypes.c_uint64)), len(shape)
        self._map = types.SimpleNamespace(members=table, count=len(shapes))
        self._ranges = ([(BASE, total * 2, 0)], [0] * len(shapes))

    def ranges(self):
        return self._ranges


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=300)
    args = ap.parse_args()
    sys.modules["torch"] = stand_in_torch()
    mapping = TableMapping()
    out = _objmap.to_torch(mapping, "cuda")
    assert len(out) == mapping._map.count, (len(out), mapping._map.count)
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        _objmap.to_torch(mapping, "cuda")
        times.append((time.perf_counter() - t0) * 1e3)
    q1, med, q3 = statistics.quantiles(times, n=4)
    print(f"to_torch of {mapping._map.count} members, gpufs's Python alone: "
          f"median {med:.3f} ms (quartiles {q1:.3f}-{q3:.3f}) over {args.runs} runs")


if __name__ == "__main__":
    main()
