# Sourced by the example scripts: finds gpufs, libgpufs and the Python
# package (installed, or in a build tree), mounts a private gpufs with the GPU
# store, and unmounts it on exit. Exits 77 (skipped) without a GPU or torch.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
repo=$(cd "$here/.." && pwd)
if ! nvidia-smi -L >/dev/null 2>&1; then echo "no GPU: skipped"; exit 77; fi
if ! python3 -c "import torch" 2>/dev/null; then echo "no torch: skipped"; exit 77; fi
GPUFS_BIN=${GPUFS_BIN:-$(command -v gpufs || echo "$repo/build/bin/gpufs")}
export GPUFS_LIB=${GPUFS_LIB:-$(dirname "$GPUFS_BIN")/../client/libgpufs.so}
[ -e "$GPUFS_LIB" ] || export GPUFS_LIB=/usr/local/lib/libgpufs.so
export PYTHONPATH=$repo/python${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
work=$(mktemp -d /tmp/gpufs-example-XXXXXX)
mnt=$work/mnt
mkdir -p "$mnt"
"$GPUFS_BIN" mount "$mnt" --state "$work/state" --store gpu --capacity "${GPUFS_CAPACITY:-32G}"
cleanup() { umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
