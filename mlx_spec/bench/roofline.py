"""The `roofline` suite: plain decoding of each model against the machine's memory roofline.

Decoding one token reads every weight once, so a model of B bytes cannot decode faster than
bandwidth / B tokens per second. The bandwidth is measured in the same run, the way decoding
reads memory: a float32 matrix-vector product (BLAS gemv, all cores) over a matrix far larger than
the caches, and, for reference, a plain sum over it. The share of the roofline a model reaches says
how much a faster kernel could still gain; speculation is the way past it (several tokens per read).
"""

import time
from typing import List

from .common import median, md_table

BANDWIDTH_GB = 1.0  # the matrix read per pass: well above any CPU cache or GPU's last-level cache
PASSES = 7


def measure_bandwidth(size_gb: float = BANDWIDTH_GB, passes: int = PASSES) -> dict:
    """GB/s read by a gemv and by a sum over a `size_gb` float32 matrix (median of `passes`, after a warm-up)."""
    import mlx.core as mx

    cols = 4096
    rows = max(1, int(size_gb * 1e9 / 4 / cols))
    w = mx.random.normal((rows, cols))
    x = mx.random.normal((cols,))
    mx.eval(w, x)
    nbytes = w.nbytes
    out = {"bytes": nbytes}
    for name, fn in (("gemv", lambda: w @ x), ("sum", lambda: mx.sum(w))):
        mx.eval(fn())  # warm-up
        times = []
        for _ in range(passes):
            t0 = time.perf_counter()
            mx.eval(fn())
            times.append(time.perf_counter() - t0)
        out[f"{name}_gbs"] = nbytes / median(times) / 1e9
        out[f"{name}_times_s"] = times
    out["gbs"] = max(out["gemv_gbs"], out["sum_gbs"])
    return out


def summarize(data: dict, rows: List[dict]) -> List[dict]:
    """The table summary plus, per model, bytes read per token and the share of the roofline reached."""
    bw = data.get("bandwidth", {}).get("gbs")
    for e in rows:
        m = data["models"].get(e["target"])
        if not m or not bw or not e.get("measurements"):
            continue
        recs = [r for r in data["records"] if r["row"] == e["key"]]
        decode = sum(r["n_tokens"] - 1 for r in recs) / max(sum(r["decode_time"] for r in recs), 1e-12)
        e.update(weights_gb=m["weights_gb"], decode_tps=decode, roofline_tps=bw / m["weights_gb"],
                 roofline_share=decode / (bw / m["weights_gb"]))
    return rows


def markdown(data: dict) -> str:
    bw = data.get("bandwidth") or {}
    lines = [f"Read bandwidth measured in this run: **{bw.get('gbs', float('nan')):.1f} GB/s** "
             f"(gemv {bw.get('gemv_gbs', float('nan')):.1f}, sum {bw.get('sum_gbs', float('nan')):.1f}, "
             f"over a {bw.get('bytes', 0) / 1e9:.1f} GB float32 matrix). Roofline tok/s = bandwidth / weight bytes "
             "(every weight is read once per decoded token; the KV cache is left out, small at these lengths).", ""]
    rows = [[e["target"], e.get("target_quant") or "", f"{e['weights_gb']:.2f}", f"{e['decode_tps']:.2f}",
             f"{e['roofline_tps']:.2f}", f"{100 * e['roofline_share']:.0f}%"]
            for e in data["summary"] if "roofline_share" in e]
    rows += [[e["target"], "", "", f"unavailable: {e['reason']}", "", ""] for e in data["summary"] if e["status"] != "ok"]
    lines.append(md_table(["Model", "Quantization", "Weights GB", "Decode tok/s", "Roofline tok/s", "Share"], rows))
    return "\n".join(lines) + "\n"
