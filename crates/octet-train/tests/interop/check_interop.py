"""Run by run.sh beside it: octet's folders in transformers / PEFT / compressed-tensors (CPU):
 base (octet checkpoint) loads; PEFT(base + octet adapter) == octet's f32 merge;
 each FP8 export: transformers' own load == a manual code x factor dequantization."""
import json, sys, struct, torch
from transformers import AutoModelForCausalLM
from safetensors.torch import load_file
W = sys.argv[1]
base_dir = f"{W}/base/checkpoints/step_000005"
tok = torch.tensor([[5, 17, 99, 3, 64, 127, 8, 8, 42, 77, 1, 0, 12, 100, 33, 90, 200, 255]])
res = {}
def logits(m):
    with torch.no_grad():
        return m(input_ids=tok).logits.float()
base = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32).eval()
L0 = logits(base)
res["base loads in transformers"] = list(L0.shape)
from peft import PeftModel
# octet merges onto the block matrices rounded to bf16 (--base-format bf16): PEFT gets
# the same base, and the plain f32 one.
base16 = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32).eval()
with torch.no_grad():
    for n, p in base16.named_parameters():
        if n.startswith("model.layers.") and n.endswith("_proj.weight"):
            p.copy_(p.to(torch.bfloat16).float())
peft_f32 = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32).eval(), f"{W}/ad/checkpoints/step_000005").eval()
res["PEFT(f32 base+adapter) vs octet merge (bf16 block matrices), max |diff|"] = (logits(peft_f32) - logits(AutoModelForCausalLM.from_pretrained(f"{W}/merged", torch_dtype=torch.float32).eval())).abs().max().item()
peft = PeftModel.from_pretrained(base16, f"{W}/ad/checkpoints/step_000005").eval()
Lp = logits(peft)
merged = AutoModelForCausalLM.from_pretrained(f"{W}/merged", torch_dtype=torch.float32).eval()
Lm = logits(merged)
res["PEFT(bf16-rounded block matrices + adapter) vs octet merge, max |diff|"] = (Lp - Lm).abs().max().item()
res["adapter changes the logits by"] = (Lp - L0).abs().max().item()
for name in ["exp-ct", "exp-ctt", "exp-blk"]:
    d = f"{W}/{name}"
    qc = json.load(open(f"{d}/config.json"))["quantization_config"]
    try:
        m = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
        Lt = logits(m)
    except Exception as e:
        res[f"{name}: transformers load"] = f"failed: {type(e).__name__}: {str(e)[:300]}"
        continue
    # Manual dequantization: code x factor, into a plain bf16/f32 model.
    sd = load_file(f"{d}/model.safetensors")
    plain = {}
    for k, v in sd.items():
        if k.endswith("_scale") or k.endswith("_scale_inv"):
            continue
        if v.dtype == torch.float8_e4m3fn:
            s = sd.get(k + "_scale", sd.get(k + "_scale_inv"))
            x = v.float()
            if s.numel() == 1 or s.shape[-1] == 1 and s.dim() == 2 and k + "_scale" in sd:
                x = x * s.float().reshape(-1, 1) if s.numel() > 1 else x * s.float().reshape(())
            else:
                n, kk = x.shape
                s = s.float().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :kk]
                x = x * s
            plain[k] = x
        else:
            plain[k] = v.float()
    ref = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32).eval()
    ref.load_state_dict(plain, strict=True)
    Ld = logits(ref)
    res[f"{name} ({qc['quant_method']}): transformers vs code x factor, max |diff|"] = (Lt - Ld).abs().max().item()
    res[f"{name}: FP8 vs f32 base, max |diff|"] = (Ld - L0).abs().max().item()
print(json.dumps(res, indent=1))

# compressed-tensors keeps the weights compressed and quantizes activations per token
# (dynamic FP8): check its codes/factors against ours and its forward against a W8A8 reference.
import types
for name in ["exp-ct", "exp-ctt"]:
    d = f"{W}/{name}"
    m = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    sd = load_file(f"{d}/model.safetensors")
    same = True
    for n, mod in m.named_modules():
        if hasattr(mod, "weight_scale"):
            same &= torch.equal(mod.weight.view(torch.uint8), sd[n + ".weight"].view(torch.uint8))
            same &= torch.equal(mod.weight_scale.float().flatten(), sd[n + ".weight_scale"].float().flatten())
    res[f"{name}: codes and factors as loaded == octet's"] = bool(same)
    Lt = logits(m)
    ref = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32).eval()
    for n, mod in ref.named_modules():
        if n + ".weight_scale" in sd:
            s = sd[n + ".weight_scale"].float()
            w = sd[n + ".weight"].float() * (s.reshape(-1, 1) if s.numel() > 1 else s.reshape(()))
            def fwd(self, x, w=w):
                xs = x.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 448.0
                xq = (x / xs).to(torch.float8_e4m3fn).float() * xs
                return xq @ w.T
            mod.forward = types.MethodType(fwd, mod)
    for n, p in ref.named_parameters():
        if not n.endswith("_proj.weight"):
            p.data.copy_(sd[n].float())
    res[f"{name}: transformers vs W8A8 reference (per-token FP8 activations), max |diff|"] = (Lt - logits(ref)).abs().max().item()
print(json.dumps(res, indent=1))
