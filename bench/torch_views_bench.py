#!/usr/bin/env python3
"""What building a state dict's tensors as views of one allocation costs in
torch alone, by the call that builds each view: the 201 tensors of the
model bench's llama layout (bf16, 256-byte aligned) over one CUDA buffer.
gpufs.load builds its tensors with torch.as_strided; this says what the
other ways of making the same views would cost.

    python3 bench/torch_views_bench.py      # a GPU, torch
"""
import time


def layout():
    """(shapes, numels, offsets, strides, total) of the llama layout, in bf16
    elements, each tensor 256-byte aligned (also bench/load_py_steps.py's)."""
    shapes = [(32000, 2048)]
    for _ in range(22):
        shapes += [(2048,), (2048, 2048), (256, 2048), (256, 2048), (2048, 2048), (2048,),
                   (5632, 2048), (5632, 2048), (2048, 5632)]
    shapes += [(2048,), (32000, 2048)]
    numels, offsets, at = [], [], 0
    for s in shapes:
        n = 1
        for d in s:
            n *= d
        numels.append(n)
        offsets.append(at)
        at += (n + 127) // 128 * 128  # 256 bytes of bf16
    strides = []
    for s in shapes:
        st, step = [], 1
        for d in reversed(s):
            st.append(step)
            step *= d
        strides.append(tuple(reversed(st)))
    return shapes, numels, offsets, strides, at


def main():
    import torch

    shapes, numels, offsets, strides, total = layout()
    base = torch.empty(total * 2, dtype=torch.uint8, device="cuda").view(torch.bfloat16)

    def as_strided():
        f = torch.as_strided
        return [f(base, s, st, off) for s, st, off in zip(shapes, strides, offsets)]

    def method_as_strided():
        f = base.as_strided
        return [f(s, st, off) for s, st, off in zip(shapes, strides, offsets)]

    def split_view():
        sizes, index, prev = [], [], 0
        for off, n in zip(offsets, numels):
            if off > prev:
                sizes.append(off - prev)
            index.append(len(sizes))
            sizes.append(n)
            prev = off + n
        sizes.append(total - prev)
        parts = base.split_with_sizes(sizes)
        return [parts[i].view(s) for i, s in zip(index, shapes)]

    def slice_view():
        return [base[off:off + n].view(s) for off, n, s in zip(offsets, numels, shapes)]

    def set_():
        storage = base.untyped_storage()
        return [torch.empty((), dtype=torch.bfloat16, device="cuda").set_(storage, off, s, st)
                for s, st, off in zip(shapes, strides, offsets)]

    want = as_strided()
    print(f"{len(shapes)} views of one CUDA buffer ({total * 2 / 2**30:.2f} GiB), 200 builds each")
    print(f"{'way':24s} {'min ms':>8s} {'median ms':>10s} {'us a view':>10s}")
    for name, fn in [("torch.as_strided", as_strided), ("Tensor.as_strided", method_as_strided),
                     ("split_with_sizes + view", split_view), ("slice + view", slice_view),
                     ("Tensor.set_", set_)]:
        got = fn()
        assert all(a.data_ptr() == b.data_ptr() and a.shape == b.shape for a, b in zip(got, want))
        times = []
        for _ in range(200):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        times.sort()
        med = times[len(times) // 2]
        print(f"{name:24s} {times[0] * 1e3:8.3f} {med * 1e3:10.3f} {med / len(shapes) * 1e6:10.2f}")


if __name__ == "__main__":
    main()
