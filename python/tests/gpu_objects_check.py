#!/usr/bin/env python3
"""Objects written and mapped as a whole, on a real GPU, through the Python
package and libgpufs (run by scripts/gpu-check.sh; needs torch):

    python3 python/tests/gpu_objects_check.py /gpu      # a mount with a GPU store, as root
    python3 python/tests/gpu_objects_check.py --tiers /gpu2   # cuda:0=1G,host=4G

- a dict of torch tensors (bfloat16 and float32, odd sizes) saved as one
  object comes back bit-identical from gpufs.load(..., device="cuda"), its
  members views into one allocation (one arena for the whole object), and a
  gpufs.open of one member reuses that mapping;
- a save that replaces an object is all or nothing: a saver killed with
  SIGKILL between its copies and its commit leaves the old object as it was
  and nothing else behind, also as another user;
- a reader who may not write the members (``nobody``) gets a private copy
  (GPUFS_INFO_PRIVATE_COPY), a member it may not read is left out and said
  so, and its copy's memory goes when it exits;
- `gpufs verify` passes on the saved object;
- with --tiers, on a mount whose GPU tier holds one such object: a second
  object spills the first (all its members: their one allocation goes), a
  load brings it back bit-identical, and after kill -9 of the worker a map
  held across the takeover still reads the same bytes and a new load too.

Prints what it saw; exits 1 on any failure.
"""

import errno
import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpufs  # noqa: E402
from gpufs import _lib, _objmap  # noqa: E402

failures = []
HERE = os.path.dirname(os.path.abspath(__file__))
PYTHONPATH = os.path.join(HERE, "..")


def check(what, ok, detail=""):
    print(f"  [{'ok' if ok else 'FAIL'}] {what}{': ' + detail if detail else ''}")
    if not ok:
        failures.append(what)


def run_as(user, code, *args):
    """Runs `code` in a fresh python3 (as `user` via setpriv, or root)."""
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    cmd = [sys.executable, "-c", textwrap.dedent(code), *args]
    if user == "nobody":
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def used_gpu_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                          "-i", "0"], capture_output=True, text=True).stdout
    return int(out.split()[0])


def wait_until(cond, seconds=10.0):
    """Polls `cond` (a daemon's release after a process died) until true."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def state_dict(torch, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return {
        "embed.weight": torch.randn(1000, 257, generator=g, device="cuda").to(torch.bfloat16),
        "layer.0.w": torch.randn(333, 129, generator=g, device="cuda"),
        "layer.0.b": torch.randn(7, generator=g, device="cuda").to(torch.bfloat16),
        "scalar": torch.randn((), generator=g, device="cuda"),
        "empty": torch.empty(0, device="cuda"),
    }


def stats(root):
    with open(os.path.join(root, ".gpufs", "stats")) as f:
        return json.load(f)


def tiers(root):
    import torch
    a, b = os.path.join(root, "a"), os.path.join(root, "b")
    g = torch.Generator(device="cuda").manual_seed(5)
    sd_a = {f"m{i}": torch.randint(0, 255, (96 << 20,), generator=g, device="cuda",
                                   dtype=torch.uint8) for i in range(6)}  # 576 MiB
    sd_b = {f"m{i}": torch.randint(0, 255, (96 << 20,), generator=g, device="cuda",
                                   dtype=torch.uint8) for i in range(6)}
    print("== spill and fault back of whole objects")
    gpufs.save(sd_a, a)
    gpufs.save(sd_b, b)
    where = {os.getxattr(os.path.join(a, k), "user.gpufs.tier").decode() for k in sd_a}
    check("the first object spilled whole", where == {"host"}, str(where))
    back = gpufs.load(a, device="cuda")
    check("it comes back bit-identical", all(torch.equal(back[k], sd_a[k]) for k in sd_a))
    del back
    gc.collect()  # its mapping goes with its last tensor: then the object may spill again
    print("== a worker takeover with a mapped object")
    held = gpufs.load(b, device="cuda")
    before = stats(root)["worker"]
    os.kill(before["pid"], signal.SIGKILL)
    check("a new worker took over", wait_until(lambda: stats(root)["worker"]["pid"] != before["pid"]),
          str(stats(root)["worker"]))
    check("the map held across it reads the same bytes",
          all(torch.equal(held[k], sd_b[k]) for k in sd_b))
    again = gpufs.load(b, device="cuda")
    check("a load after it too", all(torch.equal(again[k], sd_b[k]) for k in sd_b))


def main():
    if sys.argv[1] == "--tiers":
        tiers(sys.argv[2])
        print(f"\ngpu_objects_check --tiers: {len(failures)} failure(s)")
        return 1 if failures else 0
    root = sys.argv[1]
    import torch
    obj = os.path.join(root, "objects", "model")
    os.makedirs(os.path.dirname(obj), exist_ok=True)
    os.chmod(os.path.dirname(obj), 0o1777)

    print("== save and load a whole object")
    sd = state_dict(torch, 1)
    gpufs.save(sd, obj, type="Model")
    loaded = gpufs.load(obj, device="cuda")
    check("every member comes back", sorted(loaded) == sorted(sd), str(sorted(loaded)))
    check("bit-identical", all(torch.equal(loaded[k].reshape(-1).view(torch.uint8),
                                           sd[k].reshape(-1).view(torch.uint8)) for k in sd))
    check("dtypes and shapes kept", all(loaded[k].dtype == sd[k].dtype and
                                        loaded[k].shape == sd[k].shape for k in sd))
    one = gpufs.load(os.path.join(obj, sorted(sd)[0]), device="cuda")
    check("a member's path loads one tensor", torch.equal(one, sd[sorted(sd)[0]]))
    for where, want in ((os.path.join(root, "objects", "absent"), errno.ENOENT),
                        (os.path.dirname(gpufs.__file__), errno.EXDEV)):
        try:
            gpufs.load(where, device="cuda")
            got = 0
        except OSError as e:
            got = e.errno
        check(f"a load of {where} fails with {errno.errorcode[want]}", got == want,
              errno.errorcode.get(got, str(got)))
    meta = gpufs.meta(obj)
    check("the object's type is set", meta.get("typename") == "Model", str(meta.get("typename")))
    mapping = _objmap.map_object(obj)
    ptrs = sorted(m.ptr for m in mapping.members)
    check("members are views into one mapping", len(mapping.members) == 5 and
          ptrs[-1] - ptrs[0] < 2 << 20, f"{len(mapping.members)} members, span {ptrs[-1] - ptrs[0]}")
    ranges, alloc_of = mapping.ranges()
    inside = all(ranges[alloc_of[i]][0] <= m.ptr and
                 m.ptr + m.size <= ranges[alloc_of[i]][0] + ranges[alloc_of[i]][1]
                 for i, m in enumerate(mapping.members))
    check("one range for the object's allocation, holding every member",
          len(ranges) == 1 and inside, f"{ranges} {alloc_of}")
    views = _objmap.to_torch(mapping, "cuda")
    storages = {t.untyped_storage().data_ptr() for t in views.values()}
    check("its tensors are views of one storage (the allocation) at the members' bytes",
          storages == {ranges[0][0]} and
          all(views[m.name].data_ptr() == m.ptr for m in mapping.members
              if views[m.name].numel()) and  # torch gives an empty tensor's pointer as 0
          all(torch.equal(views[k], loaded[k]) for k in sd), f"{len(storages)} storages")
    del views
    arenas = _lib.lib().gpufs_open_arenas()
    with gpufs.open(os.path.join(obj, "layer.0.w")) as blob:
        check("gpufs.open of a member reuses its object's mapping",
              _lib.lib().gpufs_open_arenas() == arenas,
              f"{arenas} arenas before, {_lib.lib().gpufs_open_arenas()} during")
        w = torch.from_dlpack(blob)
        check("... with the member's bytes", torch.equal(w, sd["layer.0.w"]))
    mapping.close()
    del loaded
    v = subprocess.run([os.environ.get("GPUFS_BIN", "gpufs"), "verify", obj], capture_output=True,
                       text=True)
    check("gpufs verify passes on the object", v.returncode == 0 and v.stdout.count("ok\t") == 5,
          v.stdout.strip().replace("\n", " | ") + v.stderr)

    print("== a save killed before its commit leaves the old object")
    saver = """
        import ctypes, os, sys, signal
        from gpufs import _lib
        specs = (_lib.GpufsObjectSpec * 1)(_lib.GpufsObjectSpec(b"w", 1 << 20, b"uint8", None, -1))
        w = _lib.GpufsObjectWriter()
        _lib.call("gpufs_object_create", sys.argv[1].encode(), specs, 1, None, ctypes.byref(w))
        buf = (ctypes.c_char * (1 << 20))(*([b"x"] * 16))
        _lib.call("gpufs_object_copy", ctypes.byref(w), 1, (ctypes.c_uint32 * 1)(0),
                  (ctypes.c_void_p * 1)(ctypes.addressof(buf)), (ctypes.c_uint64 * 1)(1 << 20))
        print("copied", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """
    for user in ("root", "nobody"):
        target = obj if user == "root" else os.path.join(root, "objects", "nobodys")
        if user == "nobody":
            r = run_as("nobody", """
                import sys, numpy, gpufs
                gpufs.save({"w": numpy.arange(10, dtype=numpy.int32)}, sys.argv[1])
            """, target)
            check("nobody saves an object of its own", r.returncode == 0, r.stderr[-300:])
        before = sorted(os.listdir(os.path.dirname(obj)))
        old = json.dumps(gpufs.meta(target), sort_keys=True)
        r = run_as(user, saver, target)
        check(f"{user}'s saver got as far as its copies", "copied" in r.stdout, r.stderr[-300:])
        check(f"{user}'s saver was killed", r.returncode == -signal.SIGKILL, str(r.returncode))
        gone = wait_until(lambda: sorted(os.listdir(os.path.dirname(obj))) == before)
        check(f"nothing of {user}'s killed save is left", gone,
              str(sorted(os.listdir(os.path.dirname(obj)))))
        check(f"{user}'s old object is intact", json.dumps(gpufs.meta(target), sort_keys=True) == old)

    print("== a reader who may not write gets a private copy")
    os.chmod(os.path.join(obj, "scalar"), 0o600)
    base = used_gpu_mib()
    reader = """
        import sys, json, gpufs
        from gpufs import _objmap
        m = _objmap.map_object(sys.argv[1])
        print(json.dumps({"mapped": [x.name for x in m.members],
                          "copies": [x.private_copy for x in m.members],
                          "skipped": [[s.name, s.errno] for s in m.skipped]}))
    """
    r = run_as("nobody", reader, obj)
    try:
        seen = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        seen = {}
        check("nobody maps the object", False, r.stderr[-400:])
    check("nobody's map leaves out the member it may not read, with EACCES",
          seen.get("skipped") == [["scalar", 13]], str(seen.get("skipped")))
    check("nobody's members are a private copy", seen.get("copies") and all(seen["copies"]),
          str(seen.get("copies")))
    check("root's view is unchanged", torch.equal(gpufs.load(obj, device="cuda")["layer.0.w"],
                                                  sd["layer.0.w"]))
    check("the copy's GPU memory is back once nobody exited",
          wait_until(lambda: used_gpu_mib() <= base + 2), f"{base} MiB before, {used_gpu_mib()} after")

    print(f"\ngpu_objects_check: {len(failures)} failure(s)")
    for f in failures:
        print(f"  - {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
