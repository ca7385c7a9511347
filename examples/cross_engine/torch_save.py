"""PyTorch process: saves a tensor into gpufs, then views the stored blob."""
import sys

import torch

import gpufs
sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/python")
from report import emit, sha  # noqa: E402

path = sys.argv[1]
t = (torch.arange(1 << 22, dtype=torch.float32, device="cuda") * 0.25).reshape(1024, 4096)
torch.cuda.synchronize()
gpufs.save(t, path)
blob = gpufs.open(path)
view = torch.from_dlpack(blob)
emit("torch", blob, view.data_ptr(), sha(view.cpu().numpy().tobytes()),
     saved_checksum=sha(t.cpu().numpy().tobytes()))
