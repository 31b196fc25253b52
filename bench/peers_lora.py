"""PyTorch + PEFT peer of `octet lora --model 1b --device cuda`: the Llama-shaped
model of bench/peers_train.py (d=2048, 16 layers, 16 heads, SwiGLU 5632, byte
vocabulary), its weights in bf16 and frozen, PEFT LoRA adapters (r=16,
alpha=32, on q, k, v, o, gate, up, down; PEFT keeps them in f32) trained with
fused AdamW under bf16 autocast, eager and torch.compile. The same batch
(4 x 2048 tokens) as octet's run.

Usage: python3 bench/peers_lora.py OUT.json [steps]
`PEERS_LORA_DROPOUTS=0,0.1` runs each variant at each LoRA dropout (default: 0).
Prints and writes tokens/s (steps after 3 warm-up steps) and the peak memory
PyTorch's allocator reports (allocated and reserved; octet reports the
driver's used memory, which also counts the CUDA context and cuBLAS workspace).
"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers_train import B, T, V, Llama  # noqa: E402

TARGETS = ["q", "k", "v", "o", "gate", "up", "down"]


def run(name, compile_, steps, dropout=0.0):
    from peft import LoraConfig, inject_adapter_in_model

    torch.manual_seed(0)
    model = Llama().to(device="cuda", dtype=torch.bfloat16)
    model.requires_grad_(False)
    cfg = LoraConfig(r=16, lora_alpha=32, lora_dropout=dropout, target_modules=TARGETS, bias="none")
    model = inject_adapter_in_model(cfg, model)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.data = p.data.float()
    trainable = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0, fused=True)
    fwd = torch.compile(model) if compile_ else model
    tok = torch.randint(0, V, (B, T), device="cuda")
    tgt = torch.randint(0, V, (B, T), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(tok, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    steady = times[3:] if len(times) > 4 else times
    tps = B * T * len(steady) / sum(steady)
    peak = torch.cuda.max_memory_allocated()
    reserved = torch.cuda.max_memory_reserved()
    row = {
        "name": name,
        "lora_dropout": dropout,
        "tokens_per_s": tps,
        "step_ms": 1e3 * sum(steady) / len(steady),
        "peak_allocated_bytes": peak,
        "peak_reserved_bytes": reserved,
        "trainable_params": trainable,
        "loss": float(loss),
    }
    print(
        f"{name:28s} {tps:9.0f} tok/s  step {row['step_ms']:7.1f} ms  peak allocated {peak / 2**30:6.2f} GiB"
        f"  reserved {reserved / 2**30:6.2f} GiB  trainable {trainable}",
        flush=True,
    )
    del model, opt, fwd, params
    torch.cuda.empty_cache()
    return row


def main(out, steps):
    rows = []
    dropouts = [float(p) for p in os.environ.get("PEERS_LORA_DROPOUTS", "0").split(",")]
    for name, c in [("torch+peft bf16 LoRA eager", False), ("torch+peft bf16 LoRA compile", True)]:
        for p in dropouts:
            label = f"{name} dropout {p:g}" if len(dropouts) > 1 else name
            try:
                rows.append(run(label, c, steps, p))
            except Exception as e:  # noqa: BLE001
                print(f"{label}: failed: {type(e).__name__}: {e}", flush=True)
    import peft

    with open(out, "w") as f:
        json.dump(
            {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "peft": peft.__version__, "rows": rows},
            f,
            indent=1,
        )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10)
