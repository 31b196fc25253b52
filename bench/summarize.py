#!/usr/bin/env python3
"""Summary tables of the benchmark suite's output (bench/README.md); the
scripts call it at their end, and it can be run by hand on an output folder.

    python3 bench/summarize.py selftest LOG
    python3 bench/summarize.py gemm GEMM.json
    python3 bench/summarize.py linear LINEAR.json [PEERS.json]
    python3 bench/summarize.py quantize QUANTIZE.json [PEERS.json]
    python3 bench/summarize.py mixed MIXED.json [MIXED.json ...]
    python3 bench/summarize.py attention ATTENTION.json [PEERS.json]
    python3 bench/summarize.py runs --dir RUNS --names a,b [--first 4] [--tokens N]
                               [--ratios a/b,...] [--peers PEERS.json]
    python3 bench/summarize.py generate LOG [LOG ...]
    python3 bench/summarize.py table JSON [JSON ...]
    python3 bench/summarize.py metrics RUN/metrics.jsonl [--first 4] [--tokens N]

`*.json` from octet are what `octet bench ... --json` writes; PEERS.json what
bench/peers/*.py write; RUNS/NAME/metrics.jsonl what `octet train` and
`octet lora` write. tokens/s of a run is taken over its steps from --first on
(the earlier ones pay kernel compiles, the allocator's growth, warm-up);
"peak device" is the most memory the driver reported in use during a step,
"peak allocated" the memory pool's high-water mark (PyTorch's
max_memory_allocated for the peers).
"""
import argparse
import json
import os
import re
import sys

GIB = 2**30


def load(path):
    """The JSON document at `path`, or None (with a note) where it is missing."""
    if not path or not os.path.exists(path):
        print(f"  ({path}: not written; the step failed or was skipped)")
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"  ({path}: unreadable: {e})")
        return None


def table(header, rows):
    """Print rows (lists of cells) under `header`, columns aligned."""
    cells = [[str(c) for c in r] for r in [header] + rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for j, r in enumerate(cells):
        print("  " + "  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)))
        if j == 0:
            print("  " + "  ".join("-" * x for x in w))


def f(v, fmt="{:.3f}"):
    return "-" if v is None else fmt.format(v)


def octet_rows(doc):
    return {r["op"]: r for r in (doc or {}).get("rows", [])}


def peer_notes(doc):
    for key in ("skipped", "failed", "not_available"):
        for s in (doc or {}).get(key, []):
            print(f"  peer {key.replace('_', ' ')}: {s}")


# ---------------------------------------------------------------- selftest
def cmd_selftest(a):
    try:
        text = open(a.log, errors="replace").read()
    except OSError:
        print(f"  ({a.log}: not written)")
        return
    m = re.search(r"^octet selftest on (.*)$", text, re.M)
    if m:
        print(f"  device: {m.group(1)[:200]}")
    passed = len(re.findall(r"\bpass\b", text))
    fails = [l for l in text.splitlines() if re.search(r"\bFAIL\b", l)]
    m = re.search(r"^all (\d+) cases pass", text, re.M)
    if m:
        print(f"  selftest: all {m.group(1)} cases pass")
    else:
        print(f"  selftest: {len(fails)} FAIL, {passed} pass")
        for l in fails[:10]:
            print("    " + l.strip()[:200])
        last = [l for l in text.splitlines() if l.strip()][-1:]
        if not fails and last:
            print("    last line: " + last[0][:200])
    m = re.search(r"^(\d+) cases or groups skipped.*$", text, re.M)
    if m:
        print(f"  {m.group(0)}")


# ---------------------------------------------------------------- gemm
def cmd_gemm(a):
    doc = load(a.json)
    if doc is None:
        return
    rows = octet_rows(doc)
    by = {}
    for op, r in rows.items():
        m = re.match(r"gemm (bf16|fp8 (.*) tensorwise) (\d+x\d+x\d+)$", op)
        if m:
            by.setdefault(m.group(3), {})[m.group(2) or "bf16"] = r["rate"]
    if by:
        print("  GEMMs (cuBLASLt, TN, bf16 output), TFLOP/s:")
        out = []
        for shape, d in by.items():
            bf = d.get("bf16")
            fp = d.get("e4m3xe4m3")
            fast = d.get("e4m3xe4m3 fast-accum")
            out.append([shape, f(bf, "{:.0f}"), f(fp, "{:.0f}"), f(fast, "{:.0f}"),
                        f(fp / bf if fp and bf else None, "{:.2f}x"),
                        f(fast / bf if fast and bf else None, "{:.2f}x")])
        table(["M x K x N", "bf16", "FP8 e4m3", "FP8 fast-accum", "FP8/bf16", "fast/bf16"], out)
    copy = [r for op, r in rows.items() if op.startswith("copy")]
    if copy:
        print(f"  device copy in the same run: {copy[0]['rate']:.0f} GB/s (quantize rows: quantize.sh, gemm.json)")


# ---------------------------------------------------------------- linear
def cmd_linear(a):
    doc = load(a.json)
    peers = load(a.peers) if a.peers else None
    rows = octet_rows(doc)
    prow = {r["shape"]: r for r in (peers or {}).get("rows", [])}
    shapes = []
    for op in rows:
        m = re.match(r"linear fwd\+bwd bf16 (\d+x\d+x\d+)$", op)
        if m:
            shapes.append(m.group(1))
    for s in prow:
        if s not in shapes:
            shapes.append(s)
    if not shapes:
        return
    print("  Linear forward + backward, ms (octet FP8 = tensorwise, quantized backward, fast accumulation):")
    out = []
    for s in shapes:
        bf = rows.get(f"linear fwd+bwd bf16 {s}", {}).get("ms")
        fp = rows.get(f"linear fwd+bwd fp8 tensorwise quantized (fast-accum fwd/dgrad) {s}", {}).get("ms")
        p = prow.get(s, {})
        tc, ao = p.get("torch_bf16_compiled_ms"), p.get("torchao_fp8_tensorwise_compiled_ms")
        out.append([s, f(bf), f(fp), f(bf / fp if bf and fp else None, "{:.2f}x"),
                    f(p.get("torch_bf16_eager_ms")), f(tc), f(ao),
                    f(tc / ao if tc and ao else None, "{:.2f}x")])
    table(["M x K x N", "octet bf16", "octet FP8", "FP8 speedup", "torch eager", "torch compiled",
           "torchao FP8", "torchao speedup"], out)
    other = [(op, r) for op, r in rows.items() if op.startswith("linear") and r.get("vs") == "bf16"
             and "(fast-accum fwd/dgrad)" not in op]
    if other:
        print("  other octet Linear rows (speed against octet bf16 at the same shape):")
        table(["layer", "ms", "vs bf16"], [[op[:100], f(r["ms"]), f(r["ratio"], "{:.2f}x")] for op, r in other])
    peer_notes(peers)


# ---------------------------------------------------------------- quantize
def cmd_quantize(a):
    doc = load(a.json)
    peers = load(a.peers) if a.peers else None
    out = [[op.strip()[:95], f(r["ms"]), f(r["rate"], "{:.0f}"), f(r["ratio"], "{:.2f}")]
           for op, r in octet_rows(doc).items()]
    for r in (peers or {}).get("rows", []):
        out.append([("peer: " + r["op"])[:95], f(r["ms"]), f(r["gb_s"], "{:.0f}"),
                    f(r.get("ratio_to_copy", 1.0), "{:.2f}")])
    if out:
        print("  quantize kernels (GB/s on the bytes each row names; vs the d2d copy of the same run):")
        table(["op", "ms", "GB/s", "vs copy"], out)
    peer_notes(peers)


# ---------------------------------------------------------------- mixed
def cmd_mixed(a):
    rows = {}
    for p in a.json:
        rows.update(octet_rows(load(p)))
    copy = rows.get("copy d2d 1 GiB (bytes read + written)")
    if copy:
        print(f"  1 GiB device copy: {copy['rate']:.0f} GB/s (read + written)")
    pat = re.compile(r"mixed fp8 e4m3 per-channel K=(\d+) N=(\d+) M=(\d+), (\d+) weights back to back in a graph$")
    small = {}
    for op, r in rows.items():
        m = pat.match(op)
        if m:
            k, n, mm, copies = m.groups()
            bf = rows.get(f"gemm bf16 cuBLASLt K={k} N={n} M={mm}, {copies} weights back to back in a graph")
            small.setdefault(f"{k}x{n}", {})[int(mm)] = (r["ratio"], bf["ratio"] if bf else None)
    if small:
        ms = sorted({m for d in small.values() for m in d})
        print("  weight-only FP8 (E4M3 per channel, bf16 x), weights back to back in a CUDA graph:")
        print("  share of the copy's bandwidth on the weight bytes / speed against cuBLASLt bf16")
        table(["K x N"] + [f"M={m}" for m in ms],
              [[kn] + [f"{d[m][0]:.2f} / {d[m][1]:.2f}x" if m in d and d[m][1] else
                       (f"{d[m][0]:.2f}" if m in d else "-") for m in ms] for kn, d in small.items()])
    large = {}
    for op, r in rows.items():
        m = re.match(r"mixed fp8 e4m3 (per-channel|per-tensor|block128) K=(\d+) N=(\d+) M=(\d+)$", op)
        if m and r.get("unit") == "TFLOP/s":
            what, k, n, mm = m.groups()
            large.setdefault((f"{k}x{n}", int(mm)), {})[what] = (r["ratio"], r["rate"])
    if large:
        print("  large M: speed against cuBLASLt bf16 (TFLOP/s of the FP8 product)")
        table(["K x N", "M", "per-channel", "per-tensor", "block128"],
              [[kn, m] + [f"{d[w][0]:.2f}x ({d[w][1]:.0f})" if w in d else "-"
                          for w in ("per-channel", "per-tensor", "block128")]
               for (kn, m), d in large.items()])


# ---------------------------------------------------------------- attention
def cmd_attention(a):
    doc = load(a.json)
    peers = load(a.peers) if a.peers else None
    out = []
    for op, r in octet_rows(doc).items():
        out.append([("octet " + op)[:100], f(r["ms"]), f(r["rate"], "{:.0f}")])
    for r in (peers or {}).get("rows", []):
        out.append([f"torch sdpa {r['backend']} forward {r['shape']}", f(r["forward_ms"]),
                    f(r["forward_tflops"], "{:.0f}")])
        out.append([f"torch sdpa {r['backend']} backward {r['shape']}", f(r["backward_ms"]),
                    f(r["backward_tflops"], "{:.0f}")])
    if out:
        print("  causal attention, bf16 (forward 2 B H T^2 D FLOPs, backward 2.5x):")
        table(["kernel", "ms", "TFLOP/s"], out)
    peer_notes(peers)


# ---------------------------------------------------------------- runs
def read_metrics(path):
    rows = []
    with open(path) as fh:
        for line in fh:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "loss" in r and "tokens_per_s" in r:
                rows.append(r)
    return rows


def run_stats(path, first, tokens):
    """tokens/s over steps >= first, step ms, peaks, last loss of one metrics.jsonl."""
    rows = read_metrics(path)
    if not rows:
        return None
    steady = [r for r in rows if r["step"] >= first] or rows[-1:]
    tps = len(steady) / sum(1.0 / r["tokens_per_s"] for r in steady)
    dev = max((r.get("device_bytes") or 0) for r in rows)
    alloc = max((r.get("allocated_bytes") or 0) for r in rows)
    return {
        "steps": f"{steady[0]['step']}-{steady[-1]['step']}",
        "tps": tps,
        "ms": 1e3 * tokens / tps if tokens else None,
        "dev": dev / GIB if dev else None,
        "alloc": alloc / GIB if alloc else None,
        "loss": rows[-1]["loss"],
        "last": rows[-1]["step"],
    }


def cmd_runs(a):
    stats = {}
    out = []
    for name in [n for n in a.names.split(",") if n]:
        p = os.path.join(a.dir, name, "metrics.jsonl")
        s = run_stats(p, a.first, a.tokens) if os.path.exists(p) else None
        stats[name] = s
        if s is None:
            out.append([name, "(no metrics: failed or skipped)", "", "", "", "", ""])
            continue
        out.append([name, s["steps"], f(s["tps"], "{:,.0f}"), f(s["ms"], "{:.1f}"), f(s["dev"], "{:.2f}"),
                    f(s["alloc"], "{:.2f}"), f(s["loss"], "{:.4f}")])
    peers = load(a.peers) if a.peers else None
    for r in (peers or {}).get("rows", []):
        name = "peer: " + r["name"]
        stats[name] = {"tps": r["tokens_per_s"], "alloc": r["peak_allocated_bytes"] / GIB}
        out.append([name, f"{r['steps'] - r['timed_steps'] + 1}-{r['steps']}" if "timed_steps" in r else "-",
                    f(r["tokens_per_s"], "{:,.0f}"), f(r.get("step_ms"), "{:.1f}"), "-",
                    f(r["peak_allocated_bytes"] / GIB, "{:.2f}"), f(r.get("loss"), "{:.4f}")])
    table(["run", "timed steps", "tokens/s", "step ms", "peak device GiB", "peak allocated GiB", "last loss"], out)
    for pair in [p for p in (a.ratios or "").split(",") if p]:
        x, y = pair.split("/")
        sx, sy = stats.get(x), stats.get(y)
        if sx and sy:
            mem = ""
            if sx.get("dev") and sy.get("dev"):
                mem = f", peak device memory {sx['dev'] / sy['dev']:.3f}x"
            elif sx.get("alloc") and sy.get("alloc"):
                mem = f", peak allocated {sx['alloc'] / sy['alloc']:.3f}x"
            print(f"  {x} against {y}: tokens/s {sx['tps'] / sy['tps']:.3f}x"
                  f" (step time {sy['tps'] / sx['tps']:.3f}x){mem}")
    peer_notes(peers)


def cmd_metrics(a):
    s = run_stats(a.file, a.first, a.tokens)
    if s is None:
        print(f"  {a.file}: no step records")
        return
    print(f"  steps {s['steps']}: {s['tps']:,.0f} tokens/s" + (f", {s['ms']:.1f} ms a step" if s["ms"] else "")
          + f"; peak device {f(s['dev'], '{:.2f}')} GiB, peak allocated {f(s['alloc'], '{:.2f}')} GiB;"
          f" loss at step {s['last']} {s['loss']:.4f}")


# ---------------------------------------------------------------- generate
def cmd_generate(a):
    for log in a.log:
        try:
            lines = open(log, errors="replace").read().splitlines()
        except OSError:
            print(f"  ({log}: not written)")
            continue
        hdr = [i for i, l in enumerate(lines) if re.match(r"^weights\s+matrix bytes", l)]
        if not hdr:
            print(f"  {os.path.basename(log)}: no table (see the log)")
            continue
        out = []
        for l in lines[hdr[-1] + 2:]:
            cells = l.split()
            if len(cells) < 4:
                break
            out.append(cells[:4])
        print(f"  {os.path.basename(log)}:")
        table(["weights", "matrix bytes", "prefill tok/s", "decode tok/s"], out)
        if len(out) >= 2:
            try:
                print(f"  decode {out[0][0]} against {out[1][0]}: {float(out[0][3]) / float(out[1][3]):.2f}x")
            except ValueError:
                pass


# ---------------------------------------------------------------- builds
def mean_rows(paths):
    """The rows of several `octet bench` JSON files of one build (comma-separated
    paths), each row's time the mean over the files that hold it."""
    runs = [octet_rows(load(p)) for p in paths.split(",")]
    out = {}
    for op in runs[0]:
        ms = [r[op]["ms"] for r in runs if op in r and r[op].get("ms")]
        if ms:
            out[op] = {**runs[0][op], "ms": sum(ms) / len(ms)}
    return out


def cmd_builds(a):
    """Two builds' `octet bench` JSON files, row by row: the second's time over
    the first's. Each side may name several files (comma-separated), run in
    turns (ABBA), whose mean cancels a drift of the machine."""
    before, after = mean_rows(a.before), mean_rows(a.after)
    out = []
    worst = None
    for op, r in before.items():
        if op not in after or not r.get("ms") or not after[op].get("ms"):
            continue
        ratio = after[op]["ms"] / r["ms"]
        worst = ratio if worst is None else max(worst, ratio)
        out.append([op[:90], f(r["ms"]), f(after[op]["ms"]), f(ratio, "{:.3f}x")])
    if not out:
        print("  (no rows in common)")
        return
    table(["row", "before ms", "after ms", "after/before"], out)
    print(f"  slowest row of the second build: {worst:.3f}x the first's time")


# ---------------------------------------------------------------- table
ORDER = ["op", "shape", "kernel", "layer", "k", "n", "m", "weights", "ms", "gb_s", "gflops", "weight_gb_s",
         "ratio_to_copy", "speed_vs_f32", "fp8_speedup", "saved_bytes", "bytes"]


def cmd_table(a):
    for p in a.json:
        doc = load(p)
        if doc is None:
            continue
        rows = doc.get("rows", [])
        if not rows:
            continue
        if {"k", "n", "m", "weights"} <= set(rows[0]):
            cpu_mixed(doc)
            continue
        keys = []
        for r in rows:
            keys += [k for k in r if k not in keys]
        keys = [k for k in ORDER if k in keys] + [k for k in keys if k not in ORDER]
        print(f"  {doc.get('command', os.path.basename(p))}:")

        def cell(v):
            if isinstance(v, float):
                return f"{v:.4g}"
            return str(v)[:70]
        table(keys, [[cell(r.get(k, "")) for k in keys] for r in rows])


def cpu_mixed(doc):
    """`octet bench mixed --device cpu`: each weight type's ms and FP8's speedup over it."""
    rows = doc["rows"]
    first = rows[0]
    print(f"  {doc.get('command', '')}: {first.get('cpu_simd', '?')} kernels, copy {first.get('copy_gb_s', 0):.1f} GB/s"
          " (read + write); FP8 speedup = that row's time / FP8's time")
    by = {}
    for r in rows:
        by.setdefault((f"{r['k']}x{r['n']}", r["m"]), {})[r["weights"]] = r
    out = []
    for (kn, m), d in by.items():
        fp = d.get("fp8 e4m3", {})
        cells = [kn, m, f(fp.get("ms")), f(fp.get("weight_gb_s"), "{:.1f}")]
        for w in ("bf16", "f32", "f32 sgemm"):
            r = d.get(w)
            cells.append(f"{r['ms']:.3f} ({r['fp8_speedup']:.2f}x)" if r else "-")
        out.append(cells)
    table(["K x N", "M", "FP8 ms", "FP8 weight GB/s", "bf16 ms (FP8 speedup)", "f32 ms", "f32 sgemm (gemm crate)"],
          out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("selftest")
    p.add_argument("log")
    p = sub.add_parser("gemm")
    p.add_argument("json")
    for name in ("linear", "quantize", "attention"):
        p = sub.add_parser(name)
        p.add_argument("json")
        p.add_argument("peers", nargs="?")
    p = sub.add_parser("mixed")
    p.add_argument("json", nargs="+")
    p = sub.add_parser("runs")
    p.add_argument("--dir", required=True)
    p.add_argument("--names", required=True)
    p.add_argument("--first", type=int, default=4)
    p.add_argument("--tokens", type=int, default=0, help="tokens a step (for step ms)")
    p.add_argument("--ratios", default="")
    p.add_argument("--peers")
    p = sub.add_parser("metrics")
    p.add_argument("file")
    p.add_argument("--first", type=int, default=4)
    p.add_argument("--tokens", type=int, default=0)
    p = sub.add_parser("generate")
    p.add_argument("log", nargs="+")
    p = sub.add_parser("table")
    p.add_argument("json", nargs="+")
    p = sub.add_parser("builds")
    p.add_argument("before", help="JSON of the first build (several: comma-separated)")
    p.add_argument("after", help="JSON of the second build (several: comma-separated)")
    a = ap.parse_args()
    globals()["cmd_" + a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
