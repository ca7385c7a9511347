#!/usr/bin/env python3
"""Checks python/gpufs/dtypes.py (Python's thin copy) against proto/dtypes.h.

usage: check_python_dtypes.py GPUFS_PROTO_DUMP PYTHON_PACKAGE_DIR

Every row must agree on the name, the order, the element size, the DLPack
(code, bits, lanes) and the array-interface typestr, which is the .npy descr
wherever numpy has the type (None in Python where it has not).
"""
import importlib.util
import json
import subprocess
import sys

dump, package = sys.argv[1], sys.argv[2]
# The module alone: the package's __init__ would look for libgpufs.
spec = importlib.util.spec_from_file_location("gpufs_dtypes", package + "/gpufs/dtypes.py")
dtypes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dtypes)

cpp = [json.loads(line) for line in subprocess.check_output([dump], text=True).splitlines()]
py = list(dtypes.DTYPES)
errors = []
if [r["name"] for r in cpp] != [d.name for d in py]:
    errors.append(f"names differ: C++ {[r['name'] for r in cpp]} / Python {[d.name for d in py]}")
for r, d in zip(cpp, py):
    want = (r["name"], r["itemsize"], tuple(r["dlpack"]), r["npy"])
    got = (d.name, d.itemsize, tuple(d.dlpack), d.typestr)
    if want != got:
        errors.append(f"row {r['name']}: C++ {want} / Python {got}")
for e in errors:
    print("MISMATCH:", e)
print(f"{len(cpp)} C++ rows, {len(py)} Python rows, {len(errors)} mismatches")
sys.exit(1 if errors else 0)
