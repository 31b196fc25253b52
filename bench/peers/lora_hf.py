"""Hugging Face model folders of real shapes and the PyTorch + PEFT peer of
`octet lora --base FOLDER` on them (bench/lora-hf.sh).

`make SHAPE DIR` writes a model folder with random weights (normal, std
0.02, as transformers initializes them) in bf16 through transformers'
own classes and `save_pretrained`: config.json, the safetensors and their
index. Shapes: `llama-3.2-1b` (Llama 3.2 1B: width 2048, 16 blocks, 32
query and 8 key-value heads of 64, FFN 8192, vocabulary 128,256, tied
head) and `qwen2.5-1.5b` (Qwen2.5 1.5B: width 1536, 28 blocks, 12 query
and 2 key-value heads of 128, q/k/v biases, FFN 8960, vocabulary 151,936,
tied head).

`run DIR OUT.json` loads the folder with `AutoModelForCausalLM` in bf16,
frozen, adds PEFT LoRA adapters (r=16, alpha=32, on q, k, v, o, gate, up
and down projections, kept in f32) and trains them with fused AdamW under
bf16 autocast on random tokens, eager and under `torch.compile`; the loss is
transformers' own (`labels=`). Prints and writes tokens/s over the steps
after the warm-up and the allocator's peak memory.

Usage:
    python3 bench/peers/lora_hf.py make SHAPE DIR
    python3 bench/peers/lora_hf.py run DIR OUT.json [--batch 8] [--seq 2048]
                                   [--steps 10] [--warmup 3] [--runs eager,compile]
Needs PyTorch with CUDA, transformers and (for `run`) PEFT; else it prints
"skipped: ..." and exits 0.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from util import need_torch, optional, skip, timed_steps, versions, write_json  # noqa: E402

SHAPES = {
    "llama-3.2-1b": dict(
        model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
        max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
        max_position_embeddings=8192, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make(torch, shape, out):
    transformers, why = optional("transformers")
    if transformers is None:
        skip(why)
    kw = dict(SHAPES[shape])
    cfg = transformers.AutoConfig.for_model(kw.pop("model_type"), **kw)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {out}: {shape}, {n / 1e9:.3f}B parameters", flush=True)


def run(torch, folder, name, compile_, batch, seq, steps, warmup):
    import transformers
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).cuda()
    model.requires_grad_(False)
    cfg = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, bias="none")
    model = get_peft_model(model, cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.data = p.data.float()
    trainable = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0, fused=True)
    if compile_:
        torch._dynamo.reset()
    fwd = torch.compile(model) if compile_ else model
    vocab = model.config.vocab_size
    tok = torch.randint(0, vocab, (batch, seq), device="cuda")

    def one_step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(input_ids=tok, labels=tok).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    row = timed_steps(torch, name, one_step, batch, seq, steps, warmup, trainable_params=trainable)
    del model, opt, fwd, params
    torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="write a random model folder")
    m.add_argument("shape", choices=sorted(SHAPES))
    m.add_argument("dir")
    r = sub.add_parser("run", help="PEFT LoRA steps on a model folder")
    r.add_argument("dir")
    r.add_argument("out", help="JSON file to write")
    r.add_argument("--batch", type=int, default=8)
    r.add_argument("--seq", type=int, default=2048)
    r.add_argument("--steps", type=int, default=10, help="steps a run, warm-up included")
    r.add_argument("--warmup", type=int, default=3, help="first steps left out of tokens/s")
    r.add_argument("--runs", default="eager,compile", help="comma-separated: eager, compile")
    a = ap.parse_args()
    torch = need_torch()
    if a.cmd == "make":
        make(torch, a.shape, a.dir)
        return
    for mod in ("transformers", "peft"):
        if optional(mod)[0] is None:
            skip(optional(mod)[1])
    labels = {"eager": ("torch+peft bf16 LoRA eager", False), "compile": ("torch+peft bf16 LoRA compile", True)}
    rows, failed = [], []
    for key in a.runs.split(","):
        name, compile_ = labels[key.strip()]
        try:
            rows.append(run(torch, a.dir, name, compile_, a.batch, a.seq, a.steps, a.warmup))
        except Exception as e:  # noqa: BLE001 (the other runs still go)
            failed.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
            print(f"{name}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            torch.cuda.empty_cache()
    write_json(a.out, {**versions(torch), "rows": rows, "failed": failed})
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
