#!/usr/bin/env python3
"""Would grouping the LoRA base's GEMMs pay? Times, on the GPU, the ~1B model's
projection products at 8192 tokens one by one against grouped (q,k,v as one
product of N=6144; gate,up as one of N=11264; their input gradients as one
product over the stacked K), in FP8 (torch._scaled_mm, per-tensor scales) and
bf16 (torch.mm). cuBLAS(Lt) under both, as octet uses. Prints microseconds."""
import torch

M, D, F = 8192, 2048, 5632
dev = "cuda"
torch.manual_seed(0)


def timeit(fn, reps=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = []
    for _ in range(3):
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        torch.cuda.synchronize()
        best.append(s.elapsed_time(e) * 1e3 / reps)
    return min(best)


one = torch.ones((), device=dev)


def f8(shape, dt=torch.float8_e4m3fn):
    return (torch.randn(shape, device=dev) * 0.5).to(dt)


def mm8(a, w, out_dt=torch.bfloat16):
    # a (M, K) row-major, w (N, K) row-major: a @ w.T
    return torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=out_dt)


rows = []
x8 = f8((M, D))
xb = torch.randn(M, D, device=dev, dtype=torch.bfloat16)
for name, n, k in [("q/k/v fwd", D, D), ("gate/up fwd", F, D), ("down fwd", D, F)]:
    w8, wb = f8((n, k)), torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    a8 = f8((M, k)); ab = torch.randn(M, k, device=dev, dtype=torch.bfloat16)
    rows.append((name + " one", timeit(lambda: mm8(a8, w8)), timeit(lambda: ab @ wb.t())))
for name, n, k, g in [("qkv fwd grouped", 3 * D, D, 3), ("gate+up fwd grouped", 2 * F, D, 2)]:
    w8, wb = f8((n, k)), torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    rows.append((name, timeit(lambda: mm8(x8, w8)), timeit(lambda: xb @ wb.t())))
# input gradients: dX (M, D) = dY (M, N) @ W (N, D); FP8 needs W^T (D, N) K-major.
for name, n in [("q/k/v dgrad one", D), ("gate/up dgrad one", F)]:
    g8 = f8((M, n), torch.float8_e5m2); gb = torch.randn(M, n, device=dev, dtype=torch.bfloat16)
    wt8 = f8((D, n)); wb = torch.randn(n, D, device=dev, dtype=torch.bfloat16)
    rows.append((name, timeit(lambda: mm8(g8, wt8)), timeit(lambda: gb @ wb)))
for name, n in [("qkv dgrad grouped (K=6144)", 3 * D), ("gate+up dgrad grouped (K=11264)", 2 * F)]:
    g8 = f8((M, n), torch.float8_e5m2); gb = torch.randn(M, n, device=dev, dtype=torch.bfloat16)
    wt8 = f8((D, n)); wb = torch.randn(n, D, device=dev, dtype=torch.bfloat16)
    rows.append((name, timeit(lambda: mm8(g8, wt8)), timeit(lambda: gb @ wb)))
g8 = f8((M, D), torch.float8_e5m2); wt8 = f8((F, D)); gb = torch.randn(M, D, device=dev, dtype=torch.bfloat16)
wb = torch.randn(D, F, device=dev, dtype=torch.bfloat16)
rows.append(("down dgrad one", timeit(lambda: mm8(g8, wt8)), timeit(lambda: gb @ wb)))
print(f"{'product':34s} {'fp8 us':>9s} {'bf16 us':>9s} {'ratio':>6s}")
for n, a, b in rows:
    print(f"{n:34s} {a:9.1f} {b:9.1f} {a / b:6.3f}")
