"""Shared pieces of the PyTorch peers in bench/peers (not run by itself).

`need_torch()` ends the peer with "skipped: ..." and exit status 0 where
PyTorch or a CUDA GPU is missing, so that the suite records a skip, not a
failure. `optional(name)` imports a module that only some rows need
(torchao, peft), returning None and the reason where it is absent.
"""
import json
import platform
import sys


def skip(why):
    """Print the skip line the suite looks for and exit 0."""
    print(f"skipped: {why}", flush=True)
    sys.exit(0)


def need_torch():
    """The torch module, or a skip where PyTorch or a CUDA GPU is missing."""
    try:
        import torch
    except ImportError:
        skip("PyTorch (torch) not installed")
    if not torch.cuda.is_available():
        skip(f"PyTorch {torch.__version__} sees no CUDA GPU")
    return torch


def optional(name):
    """(module, None) where `name` imports, else (None, reason)."""
    try:
        return __import__(name), None
    except ImportError as e:
        return None, f"{name} not installed ({e})"
    except Exception as e:  # noqa: BLE001 (a broken install: say why)
        return None, f"{name} did not import: {type(e).__name__}: {e}"


def versions(torch):
    """What the JSON records about the software and the GPU."""
    doc = {
        "device": torch.cuda.get_device_name(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    for name in ("torchao", "peft", "triton"):
        mod, _ = optional(name)
        if mod is not None:
            doc[name] = getattr(mod, "__version__", "?")
    return doc


def median_ms(torch, fn, warmup=3, reps=20):
    """Median milliseconds of `fn()` by CUDA events, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def write_json(path, doc):
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path}", flush=True)
