"""PyTorch + PEFT peer of `octet lora --device cuda --model 1b`: the
Llama-shaped model of bench/peers/train.py (d=2048, 16 layers, 16 heads,
SwiGLU 5632, byte vocabulary, sequences of 2048), its weights in bf16 and
frozen, PEFT LoRA adapters (r=16, alpha=32, on q, k, v, o, gate, up, down;
PEFT keeps them in f32) trained with fused AdamW under bf16 autocast, eager
and under `torch.compile`. octet's LoRA runs of bench/lora-1b.sh use the same
batch (4 x 2048 tokens), rank, alpha and targets.

Usage:
    python3 bench/peers/lora.py OUT.json [--batch 4] [--steps 10] [--warmup 3]
                                [--runs eager,compile] [--dropouts 0,0.1]
Prints and writes tokens/s over the steps after the warm-up steps and the
peak memory PyTorch's allocator reports (allocated and reserved; octet
reports the driver's used memory too, which also counts the CUDA context and
cuBLAS's workspace). `--dropouts` runs each variant at each LoRA dropout.
Needs PyTorch with CUDA and PEFT (else it prints "skipped: ..." and exits 0).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from util import need_torch, optional, skip, timed_steps, versions, write_json  # noqa: E402

TARGETS = ["q", "k", "v", "o", "gate", "up", "down"]


def run(torch, name, compile_, batch, steps, warmup, dropout):
    from peft import LoraConfig, inject_adapter_in_model
    from train import T, V, Llama

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
    if compile_:
        torch._dynamo.reset()
    fwd = torch.compile(model) if compile_ else model
    tok = torch.randint(0, V, (batch, T), device="cuda")
    tgt = torch.randint(0, V, (batch, T), device="cuda")

    def one_step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(tok, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    row = timed_steps(torch, name, one_step, batch, T, steps, warmup,
                      lora_dropout=dropout, trainable_params=trainable)
    del model, opt, fwd, params
    torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--batch", type=int, default=4, help="sequences of 2048 tokens a step")
    ap.add_argument("--steps", type=int, default=10, help="steps a run, warm-up included")
    ap.add_argument("--warmup", type=int, default=3, help="first steps left out of tokens/s")
    ap.add_argument("--runs", default="eager,compile", help="comma-separated: eager, compile")
    ap.add_argument("--dropouts", default="0", help="comma-separated LoRA dropouts")
    a = ap.parse_args()
    torch = need_torch()
    peft, why = optional("peft")
    if peft is None:
        skip(why)
    dropouts = [float(p) for p in a.dropouts.split(",")]
    labels = {"eager": ("torch+peft bf16 LoRA eager", False), "compile": ("torch+peft bf16 LoRA compile", True)}
    rows, failed = [], []
    for key in a.runs.split(","):
        name, compile_ = labels[key.strip()]
        for p in dropouts:
            label = f"{name} dropout {p:g}" if len(dropouts) > 1 else name
            try:
                rows.append(run(torch, label, compile_, a.batch, a.steps, a.warmup, p))
            except Exception as e:  # noqa: BLE001 (the other runs still go)
                failed.append(f"{label}: {type(e).__name__}: {str(e)[:300]}")
                print(f"{label}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                torch.cuda.empty_cache()
    write_json(a.out, {**versions(torch), "rows": rows, "failed": failed})
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
