"""The `roofline` suite: plain decoding of each model against the machine's memory roofline.

Decoding one token reads every weight it uses once, so a model that reads B bytes per token cannot
decode faster than bandwidth / B tokens per second. B is every weight except an untied embedding
table, of which decoding reads one row (a tied table is read whole, as the output head). The
bandwidth is measured in the same run the way decoding reads memory: vector-times-matrix products
(`x @ W.T`, as a Linear layer does, on every core BLAS uses) over many matrices of the shapes of a
transformer block, about 1 GB each time, far beyond the caches; the best of several shapes, a
single large gemv and a plain sum is taken, because decoding itself reaches the best of them (a
single 1 GB gemv alone measured 5.3 GB/s here while the 0.5B decoded at 8.4 GB/s). The share of the
roofline a model reaches says how much a faster kernel could still gain; speculation is the way past
it (several tokens per read).
"""

import time
from functools import partial
from typing import Any

from ..models.base import params_bytes
from .common import md_table, median

BANDWIDTH_GB = 1.0  # bytes read per pass: well above any CPU cache or GPU's last-level cache
PASSES = 7
# (rows, cols) of the matrices read per pass: a 1.5B's MLP up/down projections, a square 4096 projection,
# a 0.5B's MLP, and one big matrix; each pass reads BANDWIDTH_GB of them.
SHAPES = ((8960, 1536), (1536, 8960), (4096, 4096), (4864, 896), (61035, 4096))


def _time(fn, passes: int) -> list[float]:
    import mlx.core as mx

    mx.eval(fn())  # warm-up
    times = []
    for _ in range(passes):
        t0 = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - t0)
    return times


def _linears(x, ws: list) -> list:
    return [x @ w.T for w in ws]


def measure_bandwidth(size_gb: float = BANDWIDTH_GB, passes: int = PASSES) -> dict:
    """GB/s read by x @ W.T over matrices of each of SHAPES, by a gemv and by a sum (each the median of
    `passes`, after a warm-up); `gbs` is the best of them."""
    import mlx.core as mx

    shapes: dict[str, float] = {}
    out: dict[str, Any] = {"shapes": shapes}
    for i, (rows, cols) in enumerate(SHAPES):
        rows = min(rows, max(1, int(size_gb * 1e9 / 4 / cols)))  # one matrix never reads more than size_gb
        n = max(1, round(size_gb * 1e9 / 4 / (rows * cols)))
        ws = [mx.random.normal((rows, cols)) for _ in range(n)]
        x = mx.random.normal((1, cols))
        mx.eval(ws, x)
        nbytes = sum(w.nbytes for w in ws)
        times = _time(partial(_linears, x, ws), passes)
        shapes[f"{rows}x{cols}"] = nbytes / median(times) / 1e9
        if i == len(SHAPES) - 1:  # the same big matrix: a gemv and a sum, for reference
            out["bytes"] = nbytes
            for name, fn in (("gemv", partial(mx.matmul, ws[0], x[0])), ("sum", partial(mx.sum, ws[0]))):
                t = _time(fn, passes)
                out[f"{name}_gbs"] = ws[0].nbytes / median(t) / 1e9
                out[f"{name}_times_s"] = t
        del ws
    out["linear_gbs"] = max(shapes.values())
    out["gbs"] = max(out["linear_gbs"], out["gemv_gbs"], out["sum_gbs"])
    return out


def bytes_per_token(model) -> int:
    """Weight bytes one decoded token reads: every parameter, less an untied embedding table (one row is read)."""
    total = params_bytes(model)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if embed is not None and getattr(model, "lm_head", None) is not None:
        total -= params_bytes(embed)
    return total


def summarize(data: dict, rows: list[dict]) -> list[dict]:
    """The table summary plus, per model, bytes read per token and the share of the roofline reached."""
    bw = data.get("bandwidth", {}).get("gbs")
    for e in rows:
        m = data["models"].get(e["target"])
        if not m or not bw or not e.get("measurements"):
            continue
        recs = [r for r in data["records"] if r["row"] == e["key"]]
        decode = sum(r["n_tokens"] - 1 for r in recs) / max(sum(r["decode_time"] for r in recs), 1e-12)
        read = m.get("read_gb", m["weights_gb"])  # result files before read_gb: every weight
        e.update(
            weights_gb=m["weights_gb"],
            read_gb=read,
            decode_tps=decode,
            roofline_tps=bw / read,
            roofline_share=decode / (bw / read),
        )
    return rows


def markdown(data: dict) -> str:
    bw = data.get("bandwidth") or {}
    shapes = ", ".join(f"{k} {v:.1f}" for k, v in bw.get("shapes", {}).items())
    lines = [
        f"Read bandwidth measured in this run: **{bw.get('gbs', float('nan')):.1f} GB/s**, the best of "
        f"x @ W.T over ~{bw.get('bytes', 0) / 1e9:.1f} GB of matrices shaped {shapes or 'n/a'} GB/s; "
        f"gemv {bw.get('gemv_gbs', float('nan')):.1f}, sum {bw.get('sum_gbs', float('nan')):.1f}. "
        "Roofline tok/s = bandwidth / bytes read per token (every weight, less an untied embedding table, "
        "of which one row is read; the KV cache is left out, small at these lengths).",
        "",
    ]
    rows = [
        [
            e["target"],
            e.get("target_quant") or "",
            f"{e['weights_gb']:.2f}",
            f"{e.get('read_gb', e['weights_gb']):.2f}",
            f"{e['decode_tps']:.2f}",
            f"{e['roofline_tps']:.2f}",
            f"{100 * e['roofline_share']:.0f}%",
        ]
        for e in data["summary"]
        if "roofline_share" in e
    ]
    rows += [
        [e["target"], "", "", "", f"unavailable: {e['reason']}", "", ""] for e in data["summary"] if e["status"] != "ok"
    ]
    lines.append(
        md_table(
            ["Model", "Quantization", "Weights GB", "Read GB/token", "Decode tok/s", "Roofline tok/s", "Share"], rows
        )
    )
    return "\n".join(lines) + "\n"
