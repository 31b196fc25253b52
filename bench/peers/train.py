"""PyTorch peer of `octet train --device cuda --model 1b`: the same Llama-shaped
model (d=2048, 16 layers, 16 heads, SwiGLU 5632, byte vocabulary of 256,
RMSNorm, RoPE, causal attention, sequences of 2048) trained with f32 master
weights under bf16 autocast, fused AdamW, gradient clipping at 1.0, and
PyTorch's flash attention (`scaled_dot_product_attention`):

- `compile`: bf16 autocast under `torch.compile`;
- `ao`: torchao float8 tensorwise training of the block linears
  (`convert_to_float8_training`; embedding and head kept in high precision)
  under `torch.compile`; skipped with a note when torchao is not installed;
- `eager`: bf16 autocast without compiling (only when asked for).

Usage:
    python3 bench/peers/train.py OUT.json [--batch 16] [--steps 10] [--warmup 3]
                                 [--runs compile,ao] [--checkpoint]
Prints and writes, for each run, tokens/s over the steps after the warm-up
steps (whose time includes the compile) and the peak memory PyTorch's
allocator reports (allocated and reserved; octet's metrics give the driver's
used memory too). `--checkpoint`: activation checkpointing of every block
(torch.utils.checkpoint, non-reentrant), as octet's `--recompute`. Random
tokens. Needs PyTorch with CUDA (else it prints "skipped: ..." and exits 0).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from util import need_torch, optional, timed_steps, versions, write_json  # noqa: E402

torch = need_torch()
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils.checkpoint  # noqa: E402

C, L, H, FF, V, T = 2048, 16, 16, 5632, 256, 2048
# Set by main(): activation checkpointing of every block.
CKPT = False


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


def run(name, compile_, fp8, batch, steps, warmup):
    if CKPT:
        name += " + checkpoint"
    torch.manual_seed(0)
    model = Llama().cuda()
    if fp8:
        from torchao.float8 import convert_to_float8_training
        convert_to_float8_training(model.blocks)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    if compile_:
        torch._dynamo.reset()
    fwd = torch.compile(model) if compile_ else model
    tok = torch.randint(0, V, (batch, T), device="cuda")
    tgt = torch.randint(0, V, (batch, T), device="cuda")
    row = timed_steps(torch, name, lambda: step(fwd, model, opt, tok, tgt), batch, T, steps, warmup)
    del model, opt, fwd
    torch.cuda.empty_cache()
    return row


def main():
    global CKPT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--batch", type=int, default=16, help="sequences of 2048 tokens a step")
    ap.add_argument("--steps", type=int, default=10, help="steps a run, warm-up included")
    ap.add_argument("--warmup", type=int, default=3, help="first steps left out of tokens/s")
    ap.add_argument("--runs", default="compile,ao", help="comma-separated: eager, compile, ao")
    ap.add_argument("--checkpoint", action="store_true", help="activation checkpointing of every block")
    a = ap.parse_args()
    CKPT = a.checkpoint
    runs = {
        "eager": ("torch bf16 eager", False, False),
        "compile": ("torch bf16 compile", True, False),
        "ao": ("torchao float8 tensorwise compile", True, True),
    }
    rows, skipped, failed = [], [], []
    for key in a.runs.split(","):
        name, compile_, fp8 = runs[key.strip()]
        if fp8:
            ao, why = optional("torchao")
            if ao is None:
                skipped.append(f"{name}: {why}")
                print(f"{name}: skipped: {why}", flush=True)
                continue
        try:
            rows.append(run(name, compile_, fp8, a.batch, a.steps, a.warmup))
        except Exception as e:  # noqa: BLE001 (an OOM, say: the other runs still go)
            failed.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
            print(f"{name}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            torch.cuda.empty_cache()
    write_json(a.out, {**versions(torch), "rows": rows, "skipped": skipped, "failed": failed})
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
