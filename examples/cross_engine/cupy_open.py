"""CuPy process: opens the blob PyTorch saved, through DLPack and the CUDA array interface."""
import sys

import cupy

import gpufs
sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/python")
from report import emit, sha  # noqa: E402

blob = gpufs.open(sys.argv[1])
a = cupy.from_dlpack(blob)
b = cupy.asarray(blob)  # __cuda_array_interface__
assert a.data.ptr == b.data.ptr
emit("cupy", blob, a.data.ptr, sha(cupy.asnumpy(a).tobytes()), shape=list(a.shape),
     dtype=str(a.dtype))
