"""Builds a random directed graph in CSR form and stores it in gpufs as one
object of type Graph: members row_offsets (int64, V+1) and col_indices
(int32, E), fields num_vertices and num_edges. Loaded once; every process
then traverses the same copy in GPU memory.

    python3 make_graph.py /gpu/graph [--vertices N] [--degree D] [--seed S]
"""
import argparse
import os

import numpy as np

import gpufs

p = argparse.ArgumentParser()
p.add_argument("path")
p.add_argument("--vertices", type=int, default=1 << 20)
p.add_argument("--degree", type=int, default=8)
p.add_argument("--seed", type=int, default=1)
args = p.parse_args()

rng = np.random.default_rng(args.seed)
v = args.vertices
degrees = rng.integers(0, 2 * args.degree, size=v)
row_offsets = np.zeros(v + 1, dtype=np.int64)
np.cumsum(degrees, out=row_offsets[1:])
col_indices = rng.integers(0, v, size=int(row_offsets[-1]), dtype=np.int32)

gpufs.save({"row_offsets": row_offsets, "col_indices": col_indices}, args.path, type="Graph")
os.setxattr(args.path, "user.num_vertices", str(v).encode())
os.setxattr(args.path, "user.num_edges", str(len(col_indices)).encode())
print(f"graph {args.path}: {v} vertices, {len(col_indices)} edges, "
      f"{(row_offsets.nbytes + col_indices.nbytes) / 2**20:.1f} MiB")
