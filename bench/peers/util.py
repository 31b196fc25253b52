"""Shared pieces of the PyTorch peers in bench/peers (not run by itself).

`need_torch()` ends the peer with "skipped: ..." and exit status 0 where
PyTorch or a CUDA GPU is missing, so that the suite records a skip, not a
failure. `optional(name)` imports a module that only some rows need
(torchao, peft), returning None and the reason where it is absent.
"""
import json
import time
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


def timed_steps(torch, name, step, batch, seq, steps, warmup, **extra):
    """Run `step()` (one optimizer step, returning the loss tensor) `steps`
    times between CUDA synchronizations, from reset peak-memory counters.
    Returns the result row: tokens/s and step time over the steps after the
    first `warmup` (the last step alone if there are no more), the first
    step's seconds, peak allocated and reserved bytes, the last loss, and
    `extra` fields; prints it on one line."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    steady = times[warmup:] if len(times) > warmup else times[-1:]
    row = {
        "name": name,
        "batch": batch,
        "seq": seq,
        "steps": steps,
        "timed_steps": len(steady),
        "tokens_per_s": batch * seq * len(steady) / sum(steady),
        "step_ms": 1e3 * sum(steady) / len(steady),
        "first_step_s": times[0],
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "loss": loss.item(),
        **extra,
    }
    print(f"{name:36s} {row['tokens_per_s']:10.0f} tok/s  step {row['step_ms']:7.1f} ms"
          f"  peak allocated {row['peak_allocated_bytes'] / 2**30:6.2f} GiB"
          f"  reserved {row['peak_reserved_bytes'] / 2**30:6.2f} GiB  loss {row['loss']:.4f}"
          + "".join(f"  {k} {v}" for k, v in extra.items()), flush=True)
    return row


def write_json(path, doc):
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path}", flush=True)
