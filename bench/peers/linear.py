"""PyTorch peers of `octet bench linear --device cuda`: one Linear layer's
forward + backward (output, input gradient and weight gradient; no bias) at
the same shapes, on the same GPU:

- PyTorch bf16 `nn.Linear`, eager and under `torch.compile`;
- torchao float8 tensorwise training (`convert_to_float8_training`, the
  "tensorwise" recipe) under `torch.compile`, as torchao's own benchmarks
  run it; skipped with a note when torchao is not installed.

Medians of CUDA-event timings (triton.testing.do_bench where Triton is there)
on random bf16 inputs; TFLOP/s count 6 M K N.

Usage:
    python3 bench/peers/linear.py OUT.json [--shapes MxKxN,...]
Default shapes: 16384x4096x14336,8192x8192x8192,4096x4096x4096,2048x4096x4096
(those of `octet bench linear --device cuda`). Prints one JSON line a shape
and writes them all to OUT.json. Needs PyTorch with CUDA (else it prints
"skipped: ..." and exits 0).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from util import need_torch, optional, versions, write_json, median_ms  # noqa: E402

DEFAULT_SHAPES = "16384x4096x14336,8192x8192x8192,4096x4096x4096,2048x4096x4096"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="MxKxN[,MxKxN...]")
    a = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]

    torch = need_torch()
    import torch.nn as nn

    try:
        from triton.testing import do_bench

        def time_ms(fn):
            return do_bench(fn, warmup=50, rep=200, return_mode="median")
    except ImportError:
        def time_ms(fn):
            return median_ms(torch, fn, warmup=10, reps=50)

    ao, why = optional("torchao")
    if ao is not None:
        try:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        except Exception as e:  # noqa: BLE001
            ao, why = None, f"torchao.float8 did not import: {type(e).__name__}: {e}"
    skipped = []
    if ao is None:
        skipped.append(f"torchao float8 tensorwise: {why}")
        print(f"torchao float8 tensorwise: skipped: {why}", flush=True)

    def step_fn(lin):
        def step(x, dy):
            lin(x).backward(dy)
        return step

    def compiled(fn):
        # A fresh compile per layer: no recompiles against the compile cache's
        # limit, no dynamic shapes carried over from the shape before.
        torch._dynamo.reset()
        return torch.compile(fn, dynamic=False)

    torch.manual_seed(0)
    rows = []
    for m, k, n in shapes:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        flops = 6 * m * k * n
        lin = nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        row = {"shape": f"{m}x{k}x{n}"}
        f = step_fn(lin)
        row["torch_bf16_eager_ms"] = time_ms(lambda: f(x, dy))
        fc = compiled(step_fn(lin))
        row["torch_bf16_compiled_ms"] = time_ms(lambda: fc(x, dy))
        if ao is not None:
            seq = nn.Sequential(nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16))
            convert_to_float8_training(seq, config=Float8LinearConfig.from_recipe_name("tensorwise"))
            fa = compiled(step_fn(seq))
            row["torchao_fp8_tensorwise_compiled_ms"] = time_ms(lambda: fa(x, dy))
            del seq, fa
        for key in [k_ for k_ in row if k_.endswith("_ms")]:
            row[key[:-3] + "_tflops"] = flops / row[key] / 1e9
        rows.append(row)
        print(json.dumps(row), flush=True)
        del x, dy, lin, fc
        torch.cuda.empty_cache()
    write_json(a.out, {**versions(torch), "rows": rows, "skipped": skipped})


if __name__ == "__main__":
    main()
