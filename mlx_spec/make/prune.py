"""Magnitude pruning for draft models (draft-model-generation-compression §3.2): unstructured, n x n blocks, N:M.

Every method scores by the L1 norm (|w| for a single weight, the sum of |w| over a block) and zeroes
the lowest-scoring weights or blocks of each matrix. Only the linear weights inside the transformer
blocks are pruned: the embedding, the output head and the norms are left whole (a zeroed norm scale
removes a whole channel). MLX has no sparse kernels, so a pruned matrix is stored and multiplied
dense: pruning changes what the draft computes, not its size or speed (quantize it for that).
"""

from dataclasses import dataclass

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import ConvertError

SPEC_HELP = "unstructured:S | block:N:S (N x N blocks) | N:M (keep N of every M), S = sparsity in [0, 1)"


@dataclass(frozen=True)
class Prune:
    method: str  # "unstructured", "block" or "nm"
    sparsity: float = 0.0  # share of weights (or blocks) zeroed; N:M implies 1 - n/m
    block: int = 0  # side of the square blocks (block)
    n: int = 0  # weights kept per group (nm)
    m: int = 0  # group size along a row (nm)

    def as_dict(self) -> dict:
        d: dict[str, str | int | float] = {"method": self.method}
        if self.method == "nm":
            d.update(n=self.n, m=self.m)
        else:
            d["sparsity"] = self.sparsity
            if self.method == "block":
                d["block"] = self.block
        return d


def parse_prune(spec: str) -> Prune:
    """'unstructured:0.25', 'block:16:0.25' or '2:4'; a clear ConvertError otherwise."""
    parts = spec.strip().lower().split(":")

    def number(text, kind):
        try:
            return kind(text)
        except ValueError:
            raise ConvertError(f"--prune '{spec}': '{text}' is not a number ({SPEC_HELP})") from None

    def sparsity(text):
        s = number(text, float)
        if not 0.0 <= s < 1.0:
            raise ConvertError(f"--prune '{spec}': sparsity must be in [0, 1), got {s}")
        return s

    if parts[0] == "unstructured" and len(parts) == 2:
        return Prune("unstructured", sparsity(parts[1]))
    if parts[0] == "block" and len(parts) == 3:
        side = number(parts[1], int)
        if side < 1:
            raise ConvertError(f"--prune '{spec}': the block side must be >= 1, got {side}")
        return Prune("block", sparsity(parts[2]), block=side)
    if len(parts) == 2 and all(p.isdigit() for p in parts):
        n, m = int(parts[0]), int(parts[1])
        if not 0 < n < m:
            raise ConvertError(f"--prune '{spec}': N:M needs 0 < N < M, got {n}:{m}")
        return Prune("nm", 1.0 - n / m, n=n, m=m)
    raise ConvertError(f"--prune must be {SPEC_HELP}; got '{spec}'")


def unstructured_mask(w: mx.array, sparsity: float) -> mx.array:
    """1 where a weight is kept: exactly round(sparsity * size) weights of lowest |w| are zeroed."""
    drop = round(sparsity * w.size)
    if drop == 0:
        return mx.ones(w.shape, dtype=mx.bool_)
    flat = mx.abs(w.astype(mx.float32)).reshape(-1)
    order = mx.argsort(flat)  # ties break by position, so the count is exact
    mask = mx.ones(flat.shape, dtype=mx.bool_)
    mask[order[:drop]] = False
    return mask.reshape(w.shape)


def block_mask(w: mx.array, side: int, sparsity: float) -> mx.array:
    """1 where a weight is kept: the round(sparsity * blocks) side x side blocks of lowest L1 norm are zeroed."""
    rows, cols = w.shape
    if rows % side or cols % side:
        raise ConvertError(f"--prune block:{side}: a {rows}x{cols} matrix does not split into {side}x{side} blocks")
    blocks = mx.abs(w.astype(mx.float32)).reshape(rows // side, side, cols // side, side).sum(axis=(1, 3))
    keep = unstructured_mask(blocks, sparsity)  # the same exact-count rule over block norms
    return mx.repeat(mx.repeat(keep, side, axis=0), side, axis=1)


def nm_mask(w: mx.array, n: int, m: int) -> mx.array:
    """1 where a weight is kept: in every group of m consecutive weights of a row, the n of largest |w|."""
    rows, cols = w.shape
    if cols % m:
        raise ConvertError(f"--prune {n}:{m}: a row of {cols} weights does not split into groups of {m}")
    groups = mx.abs(w.astype(mx.float32)).reshape(rows, cols // m, m)
    rank = mx.argsort(mx.argsort(groups, axis=-1), axis=-1)  # 0 = smallest in its group
    return (rank >= m - n).reshape(rows, cols)


def mask_for(w: mx.array, p: Prune) -> mx.array:
    if p.method == "unstructured":
        return unstructured_mask(w, p.sparsity)
    if p.method == "block":
        return block_mask(w, p.block, p.sparsity)
    return nm_mask(w, p.n, p.m)


def prune_model(model, p: Prune) -> tuple[dict, float]:
    """Zero weights of every block's linear layers in place; returns (provenance op, measured sparsity)."""
    inner = getattr(model, "model", model)
    if not hasattr(inner, "layers"):
        raise ConvertError(f"--prune: mlx-lm's {type(model).__module__} keeps its blocks elsewhere")
    pruned, zeros, total = {}, 0, 0
    for i, layer in enumerate(inner.layers):
        updates = []
        for path, w in dict(tree_flatten(layer.parameters())).items():
            if not path.endswith(".weight") or w.ndim != 2:
                continue
            mask = mask_for(w, p)
            new = mx.where(mask, w, mx.zeros_like(w))
            mx.eval(new)
            zeros += int((~mask).sum())
            total += w.size
            updates.append((path, new))
        if updates:
            layer.update(tree_unflatten(updates))
        pruned[i] = len(updates)
    if total == 0:
        raise ConvertError("--prune: the model's blocks have no 2-D linear weights to prune")
    measured = zeros / total
    return {
        "op": "prune",
        **p.as_dict(),
        "measured_sparsity": round(measured, 6),
        "matrices": sum(pruned.values()),
    }, measured
