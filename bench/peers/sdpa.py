"""PyTorch peer of `octet bench attention --device cuda`: causal attention
(`scaled_dot_product_attention`) at the same shape, forward and backward, per
backend (flash, cuDNN, memory-efficient), in octet's FLOP convention: forward
2 B H T^2 D (the causal half of two products), backward 2.5x the forward's.
bf16 inputs, medians of CUDA-event timings.

Usage:
    python3 bench/peers/sdpa.py OUT.json [--shape BxTxHxD]
Default shape 4x2048x16x128 (octet's default: the ~1B model's attention at
batch 4). A backend this PyTorch or GPU lacks is reported as not available.
Needs PyTorch with CUDA (else it prints "skipped: ..." and exits 0).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from util import median_ms, need_torch, versions, write_json  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--shape", default="4x2048x16x128", help="BxTxHxD")
    a = ap.parse_args()
    B, T, H, D = (int(v) for v in a.shape.split("x"))

    torch = need_torch()
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    go = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16) * 1e-2
    fwd_flop = 2 * B * H * T * T * D
    rows, missing = [], []
    for name, be in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                     ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
        try:
            with sdpa_kernel(be):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                fms = median_ms(torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                bms = median_ms(torch, lambda: torch.autograd.grad(out, (q, k, v), go, retain_graph=True))
        except Exception as ex:  # noqa: BLE001
            missing.append(f"{name}: {str(ex)[:160]}")
            print(f"torch sdpa {name}: not available ({str(ex)[:160]})", flush=True)
            continue
        row = {
            "backend": name,
            "shape": f"B={B} T={T} H={H} D={D}",
            "forward_ms": fms,
            "forward_tflops": fwd_flop / fms / 1e9,
            "backward_ms": bms,
            "backward_tflops": 2.5 * fwd_flop / bms / 1e9,
        }
        rows.append(row)
        print(f"torch sdpa {name:9s} B={B} T={T} H={H} D={D}: forward {fms:.3f} ms "
              f"{row['forward_tflops']:.1f} TFLOP/s, backward {bms:.3f} ms {row['backward_tflops']:.1f} TFLOP/s",
              flush=True)
    write_json(a.out, {**versions(torch), "rows": rows, "not_available": missing})


if __name__ == "__main__":
    main()
