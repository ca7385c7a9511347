"""Saves a transformers model's weights into gpufs as one object, once.

    python3 save.py /gpu/llama WORKDIR [--layers 22]

The model is a Llama of TinyLlama-1.1B's shapes with random weights (no
download: the same code saves any `from_pretrained` model). Writes the
config and the logits of a fixed prompt to WORKDIR for the workers to build
the model from and compare against.
"""
import argparse
import json
import os
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import gpufs

ap = argparse.ArgumentParser()
ap.add_argument("object")
ap.add_argument("work")
ap.add_argument("--layers", type=int, default=22)
args = ap.parse_args()

config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=args.layers,
                     num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                     tie_word_embeddings=False, torch_dtype="bfloat16")
torch.manual_seed(0)
model = LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
state = model.state_dict()
torch.cuda.synchronize()
t0 = time.perf_counter()
gpufs.save(state, args.object)  # one allocation, one commit: all or nothing
saved_ms = (time.perf_counter() - t0) * 1e3
prompt = torch.arange(1, 17, device="cuda").unsqueeze(0)
with torch.no_grad():
    logits = model(prompt).logits.float().cpu()
torch.save(logits, os.path.join(args.work, "logits.pt"))
config.save_pretrained(args.work)
nbytes = sum(t.numel() * t.element_size() for t in state.values())
print(json.dumps({"tensors": len(state), "bytes": nbytes, "save_ms": round(saved_ms, 1)}))
