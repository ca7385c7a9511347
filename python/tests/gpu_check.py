#!/usr/bin/env python3
"""gpufs on a real GPU: torch, cupy and jax share one blob's device memory.

    python3 python/tests/gpu_check.py /gpu          # a mount with a GPU store

Not a unittest: run it by hand (or from scripts) on a machine with a GPU, a
daemon serving ``--store gpu`` at MOUNTPOINT and libgpufs built with CUDA
(``$GPUFS_LIB`` if it is not found by itself).  Leave the daemon some headroom
for the frameworks (``--capacity``); jax's preallocation is turned off here.

It saves tensors with ``gpufs.save`` (torch: CAI path; torch bfloat16: DLPack
path; cupy, jax, numpy host data), opens them with ``gpufs.open`` and imports
them into torch (``torch.from_dlpack``, ``torch.as_tensor`` via CAI), cupy
(``cupy.from_dlpack``, ``cupy.asarray`` via CAI) and jax
(``jax.dlpack.from_dlpack``), checks that every import sees the blob's device
pointer and the same bytes (sha256 of a host copy), that a second process
maps the same data, and that closing defers the unmap until the last consumer
is gone.  Prints what it saw; exits 1 on any mismatch, 2 on bad usage.
"""

import argparse
import errno
import gc
import hashlib
import os
import subprocess
import sys
import time
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpufs  # noqa: E402
from gpufs import _lib, dlpack  # noqa: E402

failures = []


def check(what, ok, detail=""):
    print(f"  [{'ok' if ok else 'FAIL'}] {what}{': ' + detail if detail else ''}")
    if not ok:
        failures.append(what)


def section(title):
    """Decorator: run a check section, recording an exception as a failure."""
    def wrap(fn):
        def run(*args):
            print(f"\n== {title}")
            try:
                return fn(*args)
            except Exception:
                traceback.print_exc()
                failures.append(f"{title}: exception")
        return run
    return wrap


def sha(host_bytes):
    return hashlib.sha256(host_bytes).hexdigest()[:16]


def torch_sha(t):
    import torch
    return sha(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())


@section("torch: save (CAI path) and open from torch, cupy, jax")
def check_float32(root):
    import torch
    t = (torch.arange(4096 * 256, dtype=torch.float32, device="cuda") * 0.5).reshape(4096, 256)
    want = torch_sha(t)
    path = os.path.join(root, "t32")
    gpufs.save(t, path, type="GpuCheck")
    m = gpufs.meta(path)
    print(f"  meta: {m}")
    check("meta dtype/shape",
          (m["dtype"], m["shape"], m["state"]) == ("float32", [4096, 256], "sealed"))
    info = gpufs.info(path)
    print(f"  info: offset={info['offset']} size={info['size']} device={info['device_uuid']} "
          f"blob={info['blob_id']} gen={info['generation']}")
    check("ipc info size", info["size"] == t.numel() * 4)

    b = gpufs.open(path)
    print(f"  blob: {b}")
    seen = {}

    tt = torch.from_dlpack(b)
    seen["torch.from_dlpack"] = (tt.data_ptr(), torch_sha(tt))
    tc = torch.as_tensor(b, device="cuda")
    seen["torch.as_tensor (CAI)"] = (tc.data_ptr(), torch_sha(tc))

    try:
        import cupy
    except ImportError:
        cupy = None
        print("  (cupy not installed)")
    if cupy is not None:
        a1 = cupy.from_dlpack(b)
        seen["cupy.from_dlpack"] = (a1.data.ptr, sha(cupy.asnumpy(a1).tobytes()))
        a2 = cupy.asarray(b)
        seen["cupy.asarray (CAI)"] = (a2.data.ptr, sha(cupy.asnumpy(a2).tobytes()))

    try:
        import jax
        import jax.dlpack
        import numpy as np
    except ImportError:
        jax = None
        print("  (jax not installed)")
    if jax is not None:
        x = jax.dlpack.from_dlpack(b)
        ptr = x.unsafe_buffer_pointer() if hasattr(x, "unsafe_buffer_pointer") else None
        seen["jax.dlpack.from_dlpack"] = (ptr, sha(np.asarray(x).tobytes()))

    for name, (ptr, digest) in seen.items():
        print(f"  {name:24s} ptr=0x{ptr or 0:x} sha={digest}")
        if ptr is not None:
            check(f"{name} is zero-copy", ptr == b.ptr, f"0x{ptr:x} vs blob 0x{b.ptr:x}")
        check(f"{name} bytes", digest == want)

    # Lifetime: CAI consumers hold no reference to the mapping, so drop them
    # first; DLPack tensors hold mappings of their own (released in C).
    tc = a2 = None  # noqa: F841
    gc.collect()
    b.close()
    check("DLPack tensors keep their own mapping after close",
          _lib.call("gpufs_open_arenas") > 0, f"{_lib.call('gpufs_open_arenas')} arenas open")
    check("torch still reads after close", torch_sha(tt) == want)
    tt = a1 = x = None  # noqa: F841
    deadline = time.monotonic() + 5  # some consumers free asynchronously
    while dlpack.live_exports() and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    check("all DLPack exports released", dlpack.live_exports() == 0,
          f"{dlpack.live_exports()} live")
    check("unmapped after the last consumer",
          not b._buf.internal and _lib.call("gpufs_open_arenas") == 0,
          f"{_lib.call('gpufs_open_arenas')} arenas open")
    return path, want


@section("torch bfloat16: save (DLPack path), open from torch and jax")
def check_bfloat16(root):
    import torch
    t = torch.linspace(-4, 4, 1 << 16, device="cuda").to(torch.bfloat16)
    want = torch_sha(t)
    path = os.path.join(root, "bf16")
    gpufs.save(t, path)
    with gpufs.open(path) as b:
        check("bfloat16 has no CAI", not hasattr(b, "__cuda_array_interface__"))
        tt = torch.from_dlpack(b)
        check("torch bf16 zero-copy", tt.data_ptr() == b.ptr)
        check("torch bf16 dtype", tt.dtype == torch.bfloat16)
        check("torch bf16 bytes", torch_sha(tt) == want)
        try:
            import jax.dlpack
            import numpy as np
        except ImportError:
            return
        x = jax.dlpack.from_dlpack(b)
        check("jax bf16 dtype", str(x.dtype) == "bfloat16", str(x.dtype))
        check("jax bf16 bytes", sha(np.asarray(x).view(np.uint16).tobytes()) == want)
        del tt, x
    gc.collect()


@section("save from cupy, jax and numpy; read back with torch")
def check_other_producers(root):
    import torch
    import numpy as np
    sources = {"numpy (host)": np.arange(100_000, dtype=np.int64).reshape(1000, 100)}
    try:
        import cupy
        sources["cupy"] = cupy.arange(100_000, dtype=cupy.int64).reshape(1000, 100)
    except ImportError:
        pass
    try:
        import jax.numpy as jnp
        sources["jax"] = jnp.arange(100_000, dtype=jnp.int32).reshape(1000, 100)
    except ImportError:
        pass
    for name, src in sources.items():
        host = src if isinstance(src, np.ndarray) else np.asarray(
            src.get() if hasattr(src, "get") else src)
        path = os.path.join(root, "from_" + name.split()[0])
        gpufs.save(src, path)
        with gpufs.open(path) as b:
            tt = torch.from_dlpack(b)
            check(f"{name} -> torch bytes", sha(tt.cpu().numpy().tobytes()) == sha(host.tobytes()))
            check(f"{name} -> blob dtype", b.dtype == host.dtype.name, b.dtype)
            del tt
        gc.collect()
        back = gpufs.read_numpy(path)  # through the file: daemon copies D2H
        check(f"{name} read_numpy", back.tobytes() == host.tobytes())


@section("a second process maps the same blob")
def check_other_process(path, want):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", path],
                         capture_output=True, text=True, timeout=300)
    print("  child: " + (out.stdout.strip() or out.stderr.strip()[-2000:]))
    check("child exit status", out.returncode == 0, str(out.returncode))
    check("child sees the same bytes", f"sha={want}" in out.stdout)


@section("gpufs.open reads the tensor description while it maps (gpufs_map_described)")
def check_described(root):
    import ctypes
    import torch
    os.makedirs(root, exist_ok=True)
    plain = os.path.join(root, "plain")
    with open(plain, "wb") as f:  # no dtype/shape attributes: uint8, one dimension
        f.write(bytes(range(256)) * 16)
    desc = _lib.GpufsDescription()
    buf = _lib.GpufsBuffer()
    _lib.call("gpufs_map_described", os.fsencode(plain), ctypes.byref(buf), ctypes.byref(desc))
    check("unset attributes come back as length -1", (desc.dtype_len, desc.shape_len) == (-1, -1),
          f"{desc.dtype_len}, {desc.shape_len}")
    _lib.call("gpufs_unmap", ctypes.byref(buf))
    with gpufs.open(plain) as b:
        check("unset description: uint8, one dimension",
              (b.dtype, b.shape) == ("uint8", (4096,)), f"{b.dtype} {b.shape}")
        check("bytes of the plain member", bytes(torch.from_dlpack(b).cpu().numpy()) ==
              bytes(range(256)) * 16)
    t = torch.arange(6 * 7, dtype=torch.int16, device="cuda").reshape(6, 7)
    shaped = os.path.join(root, "shaped")
    gpufs.save(t, shaped)
    _lib.call("gpufs_map_described", os.fsencode(shaped), ctypes.byref(buf), ctypes.byref(desc))
    check("set attributes come back with their values", desc.values() == ("int16", "6,7"),
          str(desc.values()))
    _lib.call("gpufs_unmap", ctypes.byref(buf))
    # A shape too long for struct gpufs_description: ERANGE, nothing mapped,
    # and gpufs.open still answers (it reads the attribute itself).
    long_shape = ",".join(["1"] * 2100 + ["6", "7"])
    os.setxattr(shaped, "user.gpufs.shape", long_shape.encode())
    arenas = _lib.lib().gpufs_open_arenas()
    rc = _lib.lib().gpufs_map_described(os.fsencode(shaped), ctypes.byref(buf), ctypes.byref(desc))
    check("a value too long for the struct is ERANGE", rc == -errno.ERANGE, str(rc))
    check("and leaves nothing mapped", _lib.lib().gpufs_open_arenas() == arenas)
    with gpufs.open(shaped) as b:
        check("gpufs.open of the long shape", len(b.shape) == 2102 and b.shape[-2:] == (6, 7),
              f"{len(b.shape)} dims")


def child(path):
    import torch
    with gpufs.open(path) as b:
        t = torch.from_dlpack(b)
        print(f"pid={os.getpid()} ptr=0x{t.data_ptr():x} blob_ptr=0x{b.ptr:x} sha={torch_sha(t)}")
        del t
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mountpoint", nargs="?")
    parser.add_argument("--child", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    if not args.mountpoint or not os.path.ismount(args.mountpoint):
        parser.error("give the mount point of a gpufs daemon serving a GPU store")
    print(f"gpufs {gpufs.__version__} from {os.path.dirname(gpufs.__file__)}; "
          f"libgpufs: {_lib.library_path()}")
    root = os.path.join(args.mountpoint, "gpufs_check")
    result = check_float32(root)
    check_bfloat16(root)
    check_other_producers(root)
    check_described(root)
    if result:
        check_other_process(*result)
    print(f"\n{len(failures)} failure(s)" + (": " + "; ".join(failures) if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
