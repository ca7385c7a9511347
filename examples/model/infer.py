"""An inference worker: maps every tensor of the gpufs model object (no copy
into this process), runs the MLP on a fixed input, reports, and holds the
mapping until its stdin ends (examples/model/run.sh: a line on the FIFO
WORKDIR/ready says it is ready; the end of the FIFO WORKDIR/stop, its stdin,
lets it go).

    python3 infer.py /gpu/model WORKDIR INDEX
"""
import json
import os
import sys

import torch

import gpufs

path, work, index = sys.argv[1], sys.argv[2], sys.argv[3]
model = gpufs.load(path)
weights = {name: torch.from_dlpack(blob) for name, blob in model.items()}
zero_copy = all(weights[n].data_ptr() == model[n].ptr for n in weights)
mapped = sum(b.nbytes for b in model.values())
layers = sum(1 for n in weights if n.endswith(".weight"))
hidden = weights["layer0.weight"].shape[0]
torch.manual_seed(0)
x = torch.randn(64, hidden, dtype=torch.float16, device="cuda")
with torch.no_grad():
    for i in range(layers):
        x = torch.relu(x @ weights[f"layer{i}.weight"] + weights[f"layer{i}.bias"])
        x = x / (x.norm(dim=1, keepdim=True) + 1e-3)
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print(json.dumps({"worker": int(index), "pid": os.getpid(), "tensors": len(weights),
                  "mapped_bytes": mapped, "zero_copy": zero_copy,
                  "allocated_by_torch": torch.cuda.memory_allocated(),
                  "device_used": total - free, "output": round(float(x.float().sum()), 3)}),
      flush=True)
with open(os.path.join(work, "ready"), "w") as ready:
    ready.write(f"ready {index}\n")
sys.stdin.read()  # until run.sh closes the stop FIFO
