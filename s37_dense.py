"""ncu target: the dense GEMM of gate+up's shape (8192 x 28672 x 4096)."""
from pathlib import Path

import torch

import habu

text = Path("examples/gemm.habu").read_text().replace("8192 EXTENT: #N", "28672 EXTENT: #N").replace(
    "8192 EXTENT: #K", "4096 EXTENT: #K")
Path("/tmp/g.habu").write_text(text)
b = habu.build("/tmp/g.habu", "GEMM", check=False)
a = torch.randn(8192, 4096, device="cuda").bfloat16()
w = torch.randn(28672, 4096, device="cuda").bfloat16()
c = torch.empty(8192, 28672, device="cuda").bfloat16()
for _ in range(3):
    b(A=a, B=w, C=c)
torch.cuda.synchronize()
