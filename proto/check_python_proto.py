#!/usr/bin/env python3
"""Checks the Python package's thin copies of the protocol against the C++
and C originals: python/gpufs/dtypes.py against proto/dtypes.h, and
python/gpufs/_uapi.py against the ioctl numbers of include/gpufs/uapi.h.

usage: check_python_proto.py GPUFS_PROTO_DUMP PYTHON_PACKAGE_DIR [PROJECT_VERSION]

Every dtype row must agree on the name, the order, the element size, the
DLPack (code, bits, lanes) and the array-interface typestr, which is the .npy
descr wherever numpy has the type (None in Python where it has not). Every
ioctl Python names must have the header's number. With PROJECT_VERSION (the
CMake project's), the package's __version__ and pyproject.toml's version
must be it.
"""
import importlib.util
import json
import re
import subprocess
import sys

dump, package = sys.argv[1], sys.argv[2]
project_version = sys.argv[3] if len(sys.argv) > 3 else None


def module(name):
    """The module alone: the package's __init__ would look for libgpufs."""
    spec = importlib.util.spec_from_file_location("gpufs_" + name, f"{package}/gpufs/{name}.py")
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def lines(*args):
    return [json.loads(line) for line in subprocess.check_output([dump, *args], text=True).splitlines()]


dtypes, uapi = module("dtypes"), module("_uapi")
errors = []

cpp = lines()
py = list(dtypes.DTYPES)
if [r["name"] for r in cpp] != [d.name for d in py]:
    errors.append(f"names differ: C++ {[r['name'] for r in cpp]} / Python {[d.name for d in py]}")
for r, d in zip(cpp, py):
    want = (r["name"], r["itemsize"], tuple(r["dlpack"]), r["npy"])
    got = (d.name, d.itemsize, tuple(d.dlpack), d.typestr)
    if want != got:
        errors.append(f"row {r['name']}: C++ {want} / Python {got}")

ioctls = {r["name"]: r["value"] for r in lines("--ioctls")}
named = {k: v for k, v in vars(uapi).items() if k.startswith("GPUFS_IOC_")}
if not named:
    errors.append("python/gpufs/_uapi.py names no GPUFS_IOC_*")
for name, value in named.items():
    if ioctls.get(name) != value:
        errors.append(f"{name}: uapi.h {ioctls.get(name)} / Python {value}")

if project_version is not None:
    for where, pattern in ((f"{package}/gpufs/__init__.py", r'^__version__ = "([^"]*)"'),
                           (f"{package}/pyproject.toml", r'^version = "([^"]*)"')):
        with open(where) as f:
            found = re.search(pattern, f.read(), re.M)
        if found is None or found.group(1) != project_version:
            errors.append(f"{where}: version {found.group(1) if found else None} / "
                          f"the project's {project_version}")

for e in errors:
    print("MISMATCH:", e)
print(f"{len(cpp)} C++ dtype rows, {len(py)} Python rows, {len(named)} ioctls, "
      f"{len(errors)} mismatches")
sys.exit(1 if errors else 0)
