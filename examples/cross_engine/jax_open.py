"""JAX process: opens the blob PyTorch saved, through DLPack."""
import sys

import jax.dlpack
import numpy as np

import gpufs
sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/python")
from report import emit, sha  # noqa: E402

blob = gpufs.open(sys.argv[1])
x = jax.dlpack.from_dlpack(blob)
emit("jax", blob, x.unsafe_buffer_pointer(), sha(np.asarray(x).tobytes()), shape=list(x.shape),
     dtype=str(x.dtype))
