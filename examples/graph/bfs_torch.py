"""BFS from vertex 0 over the gpufs Graph object, in PyTorch, on the shared
copy (no copy into this process: torch.from_dlpack of the mapped blobs).

    python3 bfs_torch.py /gpu/graph
Prints "reached=R levels=L checksum=C" like bfs_cuda.
"""
import sys

import torch

import gpufs

graph = gpufs.load(sys.argv[1])
assert graph.typename == "Graph", graph.typename
row = torch.from_dlpack(graph["row_offsets"])
col = torch.from_dlpack(graph["col_indices"])
assert row.data_ptr() == graph["row_offsets"].ptr and col.data_ptr() == graph["col_indices"].ptr
v = row.numel() - 1
level = torch.full((v,), -1, dtype=torch.int32, device=row.device)
level[0] = 0
frontier = torch.zeros(1, dtype=torch.int64, device=row.device)
depth = 0
while frontier.numel() > 0:
    starts, ends = row[frontier], row[frontier + 1]
    counts = ends - starts
    total = int(counts.sum())
    if total == 0:
        break
    # Neighbour positions: starts[i] + 0..counts[i]-1 for every frontier vertex.
    base = torch.repeat_interleave(starts - (torch.cumsum(counts, 0) - counts), counts)
    neighbours = col[base + torch.arange(total, device=row.device)].long()
    fresh = torch.unique(neighbours[level[neighbours] < 0])
    depth += 1
    level[fresh] = depth
    frontier = fresh
reached = level >= 0
checksum = int((level[reached].long() + 1).sum())
print(f"engine=torch row_ptr=0x{row.data_ptr():x} col_ptr=0x{col.data_ptr():x}")
print(f"reached={int(reached.sum())} levels={int(level.max()) + 1} checksum={checksum}")
