"""What every example process prints: one JSON line per view of a blob."""
import hashlib
import json
import os


def sha(host_bytes):
    """The checksum the examples compare: sha256 of the bytes, first 16 hex digits."""
    return hashlib.sha256(host_bytes).hexdigest()[:16]


def emit(engine, blob, engine_ptr, checksum, **extra):
    """Prints the line run scripts parse: who saw which blob where."""
    line = {"engine": engine, "pid": os.getpid(), "path": blob.path, "blob_id": blob.blob_id,
            "generation": blob.generation, "gpufs_ptr": hex(blob.ptr),
            "engine_ptr": hex(engine_ptr), "zero_copy": engine_ptr == blob.ptr,
            "checksum": checksum}
    line.update(extra)
    print(json.dumps(line), flush=True)
