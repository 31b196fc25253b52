"""PyTorch's causal attention (scaled_dot_product_attention) at the shape of
`octet bench attention --device cuda`, per backend, forward and backward,
in the same FLOP convention (forward 2 B H T^2 D causal; backward 2.5x).

Usage: python3 bench/sdpa.py [B T H D]
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

B, T, H, D = (int(x) for x in sys.argv[1:5]) if len(sys.argv) >= 5 else (4, 2048, 16, 128)
torch.manual_seed(0)
q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
go = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16) * 1e-2
fwd_flop = 2 * B * H * T * T * D


def median_ms(f, reps=20):
    for _ in range(3):
        f()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        f()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


for name, be in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                 ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
    try:
        with sdpa_kernel(be):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            fms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            bms = median_ms(lambda: torch.autograd.grad(out, (q, k, v), go, retain_graph=True))
        print(f"torch sdpa {name:9s} B={B} T={T} H={H} D={D}: forward {fms:.3f} ms "
              f"{fwd_flop / fms / 1e9:.1f} TFLOP/s, backward {bms:.3f} ms {2.5 * fwd_flop / bms / 1e9:.1f} TFLOP/s",
              flush=True)
    except Exception as ex:  # noqa: BLE001
        print(f"torch sdpa {name}: not available ({str(ex)[:120]})")
