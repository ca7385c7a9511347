#!/usr/bin/env bash
# README.md's Python install, run as written in a fresh virtual environment
# (no system site-packages, so no setuptools, wheel or numpy) with no
# network: a network namespace of its own where that can be made, and pip
# told to use no index. Then the venv's python imports gpufs from the venv
# and saves and loads an object on a host-store mount; scripts/python-check.sh
# names the venv's python before the install (with the pip command) and
# after it.
#   python_venv_test.sh GPUFS_BIN SCRATCH PYTHON
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
gpufs=$1 scratch=$2 python=$3
rm -rf "$scratch"
mkdir -p "$scratch/mnt" "$scratch/state"
mnt=$scratch/mnt
daemon=""
cleanup() {
  if mountpoint -q "$mnt"; then umount "$mnt" || umount -l "$mnt"; fi
  if [ -n "$daemon" ]; then tail --pid="$daemon" -f /dev/null; fi  # it exits after the unmount
  rm -rf "$scratch"
}
trap cleanup EXIT
fail() { echo "python_venv_test: $*" >&2; exit 1; }

"$python" -m venv "$scratch/venv" || fail "$python -m venv failed (Debian: apt install python3-venv)"
venv_python=$scratch/venv/bin/python3
export PATH=$scratch/venv/bin:$PATH PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH

check=$("$repo/scripts/python-check.sh")
grep -qxF "gpufs: $venv_python does not see the gpufs package; add it with (no network needed):" \
  <<<"$check" || fail "python-check before the install: $check"
grep -qxF "         $venv_python -m pip install $repo/python" <<<"$check" ||
  fail "python-check gives no pip command: $check"

# The command between the README's venv marker and the end of its block.
cmd=$(sed -n '/^<!-- venv:/,/^```$/p' "$repo/README.md" | sed '/^<!--/d;/^```/d')
[ -n "$cmd" ] || fail "no venv command in README.md"
offline=()
if unshare --net true 2>/dev/null; then offline=(unshare --net); fi
(cd "$repo" && "${offline[@]}" bash -c "$cmd") >"$scratch/pip.log" 2>&1 ||
  fail "'$cmd' failed: $(cat "$scratch/pip.log")"

check=$("$repo/scripts/python-check.sh")
grep -qxF "gpufs: $venv_python imports gpufs (from $scratch/venv/lib/$(
  "$venv_python" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')/site-packages/gpufs)" \
  <<<"$check" || fail "python-check after the install: $check"

"$gpufs" mount "$mnt" --state "$scratch/state" --store host --capacity 64M ||
  fail "mount failed: $(cat "$scratch/state/gpufs.log" 2>/dev/null)"
daemon=$(cut -d" " -f1 "$scratch/state/lock")
(cd "$scratch" && "$venv_python" - "$mnt" "$scratch/venv") <<'PY' || fail "the round trip failed"
import os, sys
import gpufs
mnt, venv = sys.argv[1], sys.argv[2]
assert gpufs.__file__.startswith(venv), gpufs.__file__
try:
    import numpy  # noqa: F401
    raise SystemExit("numpy is importable: not a fresh venv")
except ImportError:
    pass
weights = bytes(range(256)) * 64
gpufs.save({"w": weights, "inner": {"b": b"\x01\x02\x03"}}, os.path.join(mnt, "m"), type="Model")
obj = gpufs.load(os.path.join(mnt, "m"))
assert obj.typename == "Model", obj.typename
assert sorted(obj) == ["inner", "w"] and list(obj["inner"]) == ["b"], obj
assert isinstance(obj["w"], gpufs.HostBlob), obj["w"]
meta = gpufs.meta(os.path.join(mnt, "m", "w"))
assert (meta["dtype"], meta["shape"], meta["size"], meta["state"]) == \
    ("uint8", [len(weights)], len(weights), "sealed"), meta
with open(os.path.join(mnt, "m", "w"), "rb") as f:
    assert f.read() == weights
with open(os.path.join(mnt, "m", "inner", "b"), "rb") as f:
    assert f.read() == b"\x01\x02\x03"
print("round trip ok")
PY
echo "python_venv_test: ok ($cmd, offline${offline:+, in a network namespace of its own})"
