"""A worker: builds the model without allocating weights, takes them from
gpufs (one request for the whole object, no copy), runs the prompt, checks
the logits against the saver's, reports and holds the model until its stdin
ends (run.sh says when).

    python3 worker.py /gpu/llama WORKDIR INDEX
"""
import json
import os
import sys
import time

import torch
from accelerate import init_empty_weights
from transformers import AutoConfig, LlamaForCausalLM

import gpufs

path, work, index = sys.argv[1], sys.argv[2], sys.argv[3]
torch.zeros(1, device="cuda")  # the CUDA context, before the clock
config = AutoConfig.from_pretrained(work)
t0 = time.perf_counter()
with init_empty_weights():
    model = LlamaForCausalLM(config)
state = gpufs.load(path, device="cuda")  # torch tensors over the daemon's memory
model.load_state_dict(state, assign=True)
# As the saver did: the buffers (rotary frequencies) onto the GPU in bf16; the
# weights are there already and stay where gpufs mapped them.
model.to(device="cuda", dtype=torch.bfloat16).eval()
torch.cuda.synchronize()
ready_ms = (time.perf_counter() - t0) * 1e3
zero_copy = all(p.data_ptr() == state[n].data_ptr() for n, p in model.named_parameters())
prompt = torch.arange(1, 17, device="cuda").unsqueeze(0)
with torch.no_grad():
    logits = model(prompt).logits.float().cpu()
expected = torch.load(os.path.join(work, "logits.pt"))
same = torch.equal(logits, expected)
max_diff = float((logits - expected).abs().max())
free, total = torch.cuda.mem_get_info()
print(json.dumps({"worker": int(index), "pid": os.getpid(), "ready_ms": round(ready_ms, 1),
                  "zero_copy": zero_copy, "same_logits": same, "max_diff": max_diff,
                  "allocated_by_torch": torch.cuda.memory_allocated()}), flush=True)
with open(os.path.join(work, "ready"), "w") as ready:
    ready.write(f"ready {index}\n")
sys.stdin.read()  # until run.sh closes the stop FIFO
