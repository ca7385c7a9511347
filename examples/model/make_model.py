"""Writes a safetensors file of a toy MLP: LAYERS float16 weight matrices of
HIDDEN x HIDDEN (4 GiB with the defaults) and their biases.

    python3 make_model.py model.safetensors [--layers 32] [--hidden 8192]
"""
import argparse
import json
import struct

import numpy as np

p = argparse.ArgumentParser()
p.add_argument("file")
p.add_argument("--layers", type=int, default=32)
p.add_argument("--hidden", type=int, default=8192)
args = p.parse_args()
h = args.hidden
rng = np.random.default_rng(0)
tensors = []
for i in range(args.layers):
    block = (rng.standard_normal((64, h)) * (1.0 / np.sqrt(h))).astype(np.float16)
    tensors.append((f"layer{i}.weight", np.tile(block, (h // 64, 1))))
    tensors.append((f"layer{i}.bias", np.zeros(h, dtype=np.float16)))
header, offset = {"__metadata__": {"format": "pt", "model": "toy-mlp", "hidden": str(h)}}, 0
for name, t in tensors:
    header[name] = {"dtype": "F16", "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
    offset += t.nbytes
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
with open(args.file, "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    for _, t in tensors:
        f.write(t.tobytes())
print(f"{args.file}: {len(tensors)} tensors, {offset / 2**30:.2f} GiB")
