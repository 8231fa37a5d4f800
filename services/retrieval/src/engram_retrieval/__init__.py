"""Engram retrieval service: gRPC MemoryService over Qdrant with ONNX models.

numpy's BLAS gets one thread unless the environment says otherwise: the vectors it
multiplies here are small, and on a few cores its thread pool and onnxruntime's fight
over them (measured on 2 cores: every Search stage about twice as slow). Set before
numpy is first imported, which is why it lives in the package's ``__init__``.
"""

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
