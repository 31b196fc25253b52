"""PyTorch peer of `octet bench quantize --device cuda`: the per-tensor
(tensorwise, current scaling) quantize of a bf16 tensor to E4M3, row-wise
and column-wise copies (the amax, the scale 448 / amax, the cast, the
transposed cast), written in PyTorch and run eager and under
`torch.compile`, beside a device-to-device copy of the same tensor.

GB/s count the minimum bytes (2 B read + 2 B written per element, as octet's
"same, on 4 B/elem" row does); "vs copy" divides by the copy's GB/s (2 B read
+ 2 B written per element). Medians of CUDA-event timings.

Usage:
    python3 bench/peers/quantize.py OUT.json [--tensor RxC]
Default tensor 16384x8192 (octet's default on the GPU). Needs PyTorch with
CUDA and float8 dtypes (else it prints "skipped: ..." and exits 0).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from util import median_ms, need_torch, skip, versions, write_json  # noqa: E402

E4M3_MAX = 448.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--tensor", default="16384x8192", help="RxC")
    a = ap.parse_args()
    r, c = (int(v) for v in a.tensor.split("x"))

    torch = need_torch()
    if not hasattr(torch, "float8_e4m3fn"):
        skip(f"PyTorch {torch.__version__} has no float8_e4m3fn")

    def quantize(x):
        amax = x.abs().amax().float()
        scale = E4M3_MAX / torch.clamp(amax, min=1e-12)
        y = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX)
        row = y.to(torch.float8_e4m3fn)
        col = y.t().contiguous().to(torch.float8_e4m3fn)
        return row, col, scale.reciprocal()

    torch.manual_seed(0)
    x = torch.randn(r, c, device="cuda", dtype=torch.bfloat16) * 4
    dst = torch.empty_like(x)
    n = r * c
    rows = []

    def add(name, ms, nbytes, copy_gbs=None):
        gbs = nbytes / ms / 1e6
        row = {"op": name, "ms": ms, "gb_s": gbs}
        if copy_gbs:
            row["ratio_to_copy"] = gbs / copy_gbs
        rows.append(row)
        print(f"{name:58s} {ms:8.3f} ms {gbs:8.1f} GB/s" + (f"  {gbs / copy_gbs:5.2f} of copy" if copy_gbs else ""),
              flush=True)
        return gbs

    copy = add(f"copy d2d bf16 {r}x{c} (read + written)", median_ms(torch, lambda: dst.copy_(x), 5, 30), 4 * n)
    add(f"torch eager quantize tensorwise bf16->e4m3 row+col {r}x{c}, on 4 B/elem",
        median_ms(torch, lambda: quantize(x), 3, 20), 4 * n, copy)
    torch._dynamo.reset()
    qc = torch.compile(quantize, dynamic=False)
    add(f"torch.compile quantize tensorwise bf16->e4m3 row+col {r}x{c}, on 4 B/elem",
        median_ms(torch, lambda: qc(x), 3, 30), 4 * n, copy)
    # The compiled codes equal the eager ones (same arithmetic): a check that
    # the timed function did the work.
    (re, ce, _), (rc, cc, _) = quantize(x), qc(x)
    same = bool(torch.equal(re.view(torch.uint8), rc.view(torch.uint8))
                and torch.equal(ce.view(torch.uint8), cc.view(torch.uint8)))
    print(f"compiled codes equal the eager ones: {same}", flush=True)
    write_json(a.out, {**versions(torch), "tensor": [r, c], "compiled_equals_eager": same, "rows": rows})


if __name__ == "__main__":
    main()
