import os

# Triton's interpreter runs the kernels on CPU tensors when a test asks for
# backend="triton"; it must be on before triton is imported anywhere. The "auto"
# backends still pick the reference on CPU.
os.environ.setdefault("TRITON_INTERPRET", "1")
