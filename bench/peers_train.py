"""PyTorch peer of `octet train --model 1b --device cuda`: the same Llama-shaped
model (d=2048, 16 layers, 16 heads, SwiGLU 5632, byte vocabulary, RMSNorm, RoPE,
causal attention) trained with f32 master weights under bf16 autocast, fused
AdamW, PyTorch's flash attention (scaled_dot_product_attention), eager and
torch.compile; and, when torchao imports, torchao float8 tensorwise training of
the block linears (embedding and head kept in high precision) under torch.compile.

Usage: python3 bench/peers_train.py OUT.json [steps]
Prints and writes tokens/s (steps after 3 warm-up steps) and peak allocated memory.
"""
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.utils.checkpoint
import torch.nn.functional as F

C, L, H, FF, V, T = 2048, 16, 16, 5632, 256, 2048
# Sequences a step: PEERS_BATCH (default 4, the batch of the BENCHMARKS tables).
B = int(os.environ.get("PEERS_BATCH", "4"))
# PEERS_CHECKPOINT=1: activation checkpointing of every block
# (torch.utils.checkpoint, non-reentrant), as octet's --recompute.
CKPT = os.environ.get("PEERS_CHECKPOINT") == "1"


class RMSNorm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * self.weight


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = RMSNorm(C), RMSNorm(C)
        self.q, self.k, self.v, self.o = (nn.Linear(C, C, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(C, FF, bias=False), nn.Linear(C, FF, bias=False)
        self.down = nn.Linear(FF, C, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, t, H, C // H).transpose(1, 2)
        k = self.k(h).view(b, t, H, C // H).transpose(1, 2)
        v = self.v(h).view(b, t, H, C // H).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, C))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, C)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.norm = RMSNorm(C)
        self.head = nn.Linear(C, V, bias=False)
        d = C // H
        inv = 10000.0 ** (-torch.arange(0, d // 2, dtype=torch.float64) * 2 / d)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def forward(self, tok, tgt):
        x = self.embed(tok)
        for blk in self.blocks:
            if CKPT:
                x = torch.utils.checkpoint.checkpoint(blk, x, self.cos, self.sin, use_reentrant=False)
            else:
                x = blk(x, self.cos, self.sin)
        logits = self.head(self.norm(x)).float()
        return F.cross_entropy(logits.view(-1, V), tgt.view(-1))


def step(fwd, model, opt, tok, tgt):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = fwd(tok, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def profile_step(name, one_step):
    """PEERS_PROFILE=DIR: one more step under torch.profiler; writes the GPU
    time of each kernel name (summed over the step) to DIR/<name>.kernels.json,
    the form bench/kernel_table.py reads."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        one_step()
        torch.cuda.synchronize()
    rows = [
        {"name": e.key, "us": e.device_time_total, "count": e.count}
        for e in prof.key_averages()
        if e.device_time_total > 0
    ]
    path = os.path.join(os.environ["PEERS_PROFILE"], name.replace(" ", "-") + ".kernels.json")
    with open(path, "w") as f:
        json.dump(rows, f)


def run(name, compile_, fp8, steps):
    if CKPT:
        name += " + checkpoint"
    torch.manual_seed(0)
    model = Llama().cuda()
    if fp8:
        from torchao.float8 import convert_to_float8_training
        convert_to_float8_training(model.blocks)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if compile_ else model
    tok = torch.randint(0, V, (B, T), device="cuda")
    tgt = torch.randint(0, V, (B, T), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step(fwd, model, opt, tok, tgt)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    if os.environ.get("PEERS_PROFILE"):
        profile_step(name, lambda: step(fwd, model, opt, tok, tgt))
    steady = times[3:] if len(times) > 4 else times
    tps = B * T * len(steady) / sum(steady)
    peak = torch.cuda.max_memory_allocated()
    row = {"name": name, "tokens_per_s": tps, "peak_bytes": peak, "loss": float(loss)}
    print(f"{name:32s} {tps:10.0f} tok/s  peak {peak / 2**30:6.2f} GiB  loss {float(loss):.4f}", flush=True)
    del model, opt, fwd
    torch.cuda.empty_cache()
    return row


def main(out, steps):
    rows = [] if os.environ.get("PEERS_SKIP_EAGER") else [run("torch bf16 eager", False, False, steps)]
    rows.append(run("torch bf16 compile", True, False, steps))
    try:
        import torchao  # noqa: F401
        rows.append(run("torchao float8 tensorwise compile", True, True, steps))
    except Exception as e:  # noqa: BLE001
        print("torchao not importable:", e)
    with open(out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10)
