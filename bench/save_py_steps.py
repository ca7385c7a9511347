#!/usr/bin/env python3
"""What gpufs.save of a state dict spends in Python, with no GPU and no mount:
_save_whole's own work (the sources described, the producers waited for, the
member table built) for a llama-shaped state dict of stand-in torch CUDA
tensors, libgpufs's three calls answered at once by a stand-in that checks
the member table it is given.

    python3 bench/save_py_steps.py [--members 201] [--runs 201] [--tree DIR]

(--tree: import gpufs from DIR/python, another checkout, to compare.)

The stand-in tensors answer the attribute reads gpufs makes from Python, so
the figure leaves out what real torch's own reads cost on top (a few hundred
ns each); it is what gpufs's Python adds. Prints the median and the quartiles
of one save, in ms.
"""
import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import time
import types

_TREE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if "--tree" in sys.argv:
    _TREE = sys.argv[sys.argv.index("--tree") + 1]
sys.path.insert(0, os.path.join(_TREE, "python"))

from gpufs import _lib, _save, dtypes  # noqa: E402


def stand_in_torch():
    torch = types.ModuleType("torch")

    class dtype:  # noqa: N801 (torch's name)
        def __init__(self, name):
            self.name = name

    class device:  # noqa: N801
        def __init__(self, index):
            self.type, self.index = "cuda", index

        def __hash__(self):
            return hash((self.type, self.index))

        def __eq__(self, other):
            return (self.type, self.index) == (other.type, other.index)

    for d in dtypes.DTYPES:
        setattr(torch, d.torch, dtype(d.torch))
    torch.dtype, torch.strided = dtype, object()
    torch.cuda = types.SimpleNamespace(synchronize=lambda dev=None: None)

    class Tensor:
        __module__ = "torch"
        layout = torch.strided
        is_cuda = True

        def __init__(self, ptr, shape, dt):
            self._ptr, self.shape, self.dtype = ptr, tuple(shape), dt
            self._numel = 1
            for s in shape:
                self._numel *= s

        @property
        def device(self):  # a new object each read, as torch makes
            return device(0)

        def get_device(self):
            return 0

        def is_conj(self):
            return False

        def is_neg(self):
            return False

        def is_contiguous(self):
            return True

        def data_ptr(self):
            return self._ptr

        def numel(self):
            return self._numel

        def element_size(self):
            return 2 if self.dtype.name == "bfloat16" else 4

        @property
        def nbytes(self):
            return self._numel * self.element_size()

    torch.Tensor = Tensor
    sys.modules["torch"] = torch
    return torch


def llama(torch, members):
    parts = [("self_attn.q_proj.weight", (2048, 2048)), ("self_attn.k_proj.weight", (256, 2048)),
             ("self_attn.v_proj.weight", (256, 2048)), ("self_attn.o_proj.weight", (2048, 2048)),
             ("mlp.gate_proj.weight", (5632, 2048)), ("mlp.up_proj.weight", (5632, 2048)),
             ("mlp.down_proj.weight", (2048, 5632)), ("input_layernorm.weight", (2048,)),
             ("post_attention_layernorm.weight", (2048,))]
    sd, ptr = {}, 1 << 40
    for i in range(members):
        name, shape = parts[i % len(parts)]
        t = torch.Tensor(ptr, shape, torch.bfloat16)
        sd[f"model.layers.{i // len(parts)}.{name}"] = t
        ptr += t.nbytes
    return sd


class StandInLib:
    """libgpufs's object writer calls, answered at once; gpufs_object_create
    checks the member table (names, sizes, dtypes, shapes) it is handed."""

    def __init__(self, sd):
        self.expect = [(n.encode(), t.nbytes, t.dtype.name.encode(), t.shape)
                       for n, t in sd.items()]

    def gpufs_object_abort(self, writer):
        return 0

    def call(self, name, *args, path=None):
        if name == "gpufs_object_create":
            specs, count, writer = args[1], args[2], args[4]
            specs = ctypes.cast(specs, ctypes.POINTER(_lib.GpufsObjectSpec))
            for i in (0, count // 2, count - 1):
                s, (n, size, dt, shape) = specs[i], self.expect[i]
                got = (s.name, s.size, s.dtype, tuple(s.shape[k] for k in range(s.ndim)))
                if got != (n, size, dt, shape):
                    raise AssertionError(f"member {i}: {got} != {(n, size, dt, shape)}")
            writer._obj.device = 0
        return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", type=int, default=201)
    ap.add_argument("--runs", type=int, default=201)
    ap.add_argument("--tree", default=_TREE)
    args = ap.parse_args()
    torch = stand_in_torch()
    sd = llama(torch, args.members)
    stand_in = StandInLib(sd)
    _lib.has = lambda name: True
    _lib.lib = lambda: stand_in
    _lib.call = stand_in.call
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "m")
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            assert _save._save_whole(sd, path, None)
            times.append((time.perf_counter() - t0) * 1e3)
    q = statistics.quantiles(times, n=4)
    print(f"_save_whole of {args.members} members: median {statistics.median(times):.3f} ms "
          f"(quartiles {q[0]:.3f}-{q[2]:.3f}), {args.runs} runs")


if __name__ == "__main__":
    main()
