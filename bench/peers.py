"""Peers on the same GPU, same shapes as `octet bench gemm --device cuda`'s Linear rows:
PyTorch bf16 nn.Linear forward+backward (eager and torch.compile) and, when importable,
torchao float8 tensorwise training (torch.compile), as torchao's own benchmarks run it.

Usage: python3 bench/peers.py OUT.json   (medians of CUDA-event timings, random inputs)
"""
import json
import sys

import torch
import torch.nn as nn
from triton.testing import do_bench

SHAPES = [(16384, 4096, 14336), (8192, 8192, 8192), (4096, 4096, 4096), (2048, 4096, 4096)]


def step_fn(lin):
    def step(x, dy):
        y = lin(x)
        y.backward(dy)
    return step


def time_ms(fn, x, dy):
    return do_bench(lambda: fn(x, dy), warmup=50, rep=200, return_mode="median")


def main(out):
    torch.manual_seed(0)
    rows = []
    try:
        from torchao.float8 import convert_to_float8_training, Float8LinearConfig
        have_ao = True
    except Exception as e:  # noqa: BLE001
        print("torchao not importable:", e)
        have_ao = False
    for m, k, n in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        flops = 6 * m * k * n
        lin = nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        eager = time_ms(step_fn(lin), x, dy)
        compiled = time_ms(torch.compile(step_fn(lin)), x, dy)
        row = {"shape": f"{m}x{k}x{n}", "torch_bf16_eager_ms": eager, "torch_bf16_compiled_ms": compiled}
        if have_ao:
            ao = nn.Sequential(nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16))
            convert_to_float8_training(ao, config=Float8LinearConfig.from_recipe_name("tensorwise"))
            row["torchao_fp8_tensorwise_compiled_ms"] = time_ms(torch.compile(step_fn(ao)), x, dy)
        for key in list(row):
            if key.endswith("_ms"):
                row[key.replace("_ms", "_tflops")] = flops / row[key] / 1e9
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "rows": rows}
    with open(out, "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "peers.json")
