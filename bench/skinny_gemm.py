"""What cuBLAS (through PyTorch) does with LoRA's skinny products at the ~1B
model's shapes (M = 8192 tokens, r = 16), bf16: median milliseconds of 50 runs
and the bandwidth they reach on the bytes they must move.
Usage: python3 bench/skinny_gemm.py"""
import torch

M, R = 8192, 16


def t(f, n=50):
    for _ in range(5):
        f()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        s.record()
        f()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return sorted(ts)[len(ts) // 2]


bf = torch.bfloat16
for k, n in [(2048, 2048), (2048, 5632), (5632, 2048)]:
    x = torch.randn(M, k, device="cuda", dtype=bf)
    a = torch.randn(R, k, device="cuda", dtype=bf)
    b = torch.randn(n, R, device="cuda", dtype=bf)
    y = torch.randn(M, n, device="cuda", dtype=bf)
    u = x @ a.t()
    dy = torch.randn(M, n, device="cuda", dtype=bf)
    rows = [
        ("u = x A^T", lambda: x @ a.t(), 2 * M * k),
        ("y += u B^T", lambda: y.addmm_(u, b.t()), 4 * M * n),
        ("dB = dy^T u", lambda: dy.t() @ u, 2 * M * n),
        ("du = dy B", lambda: dy @ b, 2 * M * n),
        ("dA = du^T x", lambda: u.t() @ x, 2 * M * k),
        ("base x W^T", lambda: x @ torch.randn(n, k, device="cuda", dtype=bf).t(), 0),
    ]
    for name, f, byts in rows:
        ms = t(f)
        bw = f"{byts / ms / 1e6:7.0f} GB/s" if byts else ""
        print(f"K={k:5d} N={n:5d} {name:12s} {ms:8.3f} ms {bw}")
