import os

# Triton's interpreter runs the kernels on CPU tensors; it must be on before triton is
# imported anywhere.
os.environ.setdefault("TRITON_INTERPRET", "1")
