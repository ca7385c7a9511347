#!/usr/bin/env bash
# Example 2: a CSR graph loaded once as a gpufs object of type Graph; a CUDA
# C++ program and a PyTorch program both run BFS on the shared copy and agree.
#   examples/graph/run.sh
source "$(dirname "$0")/../python/example_env.sh"
dir=$(cd "$(dirname "$0")" && pwd)
bfs_cuda=${GPUFS_EXAMPLES_DIR:-$(dirname "$GPUFS_BIN")/../examples/cuda}/gpufs-bfs
python3 "$dir/make_graph.py" "$mnt/graph" --vertices 2000000 --degree 8
getfattr --absolute-names -d "$mnt/graph" | sed -n '2,$p'
"$bfs_cuda" "$mnt/graph" | tee "$work/cuda"
python3 "$dir/bfs_torch.py" "$mnt/graph" | tee "$work/torch"
a=$(grep '^reached=' "$work/cuda"); b=$(grep '^reached=' "$work/torch")
if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "graph: CUDA C++ and PyTorch agree: $a"; else
  echo "graph: MISMATCH: cuda '$a' torch '$b'"; exit 1; fi
