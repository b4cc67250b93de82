"""Microbenchmark: a context drafter's lookup + indexing cost vs context length (`mlx-spec bench ngram-cost`).

The drafters that read only the context (the N-gram table, the suffix automaton) run in Python on the
hot path between target steps; this measures that they stay far below a step at 1k-128k tokens.
"""

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..gen.drafters import ngram as _ngram
from ..gen.drafters import suffix as _suffix
from ..gen.registry import DEFAULT_K

CONTEXT_LENGTHS = (1_024, 8_192, 32_768, 131_072)  # 1k..128k tokens: prompt sizes up to long-context use
CALLS = 2_000  # timed propose calls per length; each adds one token, like a step accepting nothing
WARMUP = 100  # untimed calls first, so first-touch costs don't count
VOCAB = 32_000  # a typical BPE vocabulary size
TARGET_STEP_MS = 200.0  # the decode step we compare against: a large target model on this machine


@dataclass
class LookupCost:
    """Cost at one context length."""

    context: int
    us_per_propose: float  # amortized, includes indexing the one new token
    us_per_indexed_token: float  # reset(prompt) time / prompt length
    mean_draft: float  # mean draft length over the timed calls
    table_keys: int  # n-gram table keys, or suffix automaton states


def code_like_stream(n: int, seed: int = 0) -> list[int]:
    """Tokens of repeated code-like motifs (keywords, idioms) with fresh identifiers mixed in."""
    rng = random.Random(seed)
    motifs = [[rng.randrange(VOCAB) for _ in range(rng.randrange(3, 25))] for _ in range(400)]
    weights = [1.0 / (i + 1) for i in range(len(motifs))]  # Zipf-like: a few idioms dominate
    out: list[int] = []
    while len(out) < n:
        out.extend(rng.choices(motifs, weights)[0])
        out.extend(rng.randrange(VOCAB) for _ in range(rng.randrange(0, 4)))  # identifiers, literals
    return out[:n]


DRAFTERS = {"ngram": (_ngram.NGramDrafter, DEFAULT_K["ngram"]), "suffix": (_suffix.SuffixDrafter, DEFAULT_K["suffix"])}


def _size(drafter) -> int:
    return len(drafter._counts) if hasattr(drafter, "_counts") else len(drafter.index.length)


def run(lengths: Sequence[int] = CONTEXT_LENGTHS, calls: int = CALLS, drafter_kind: str = "ngram") -> list[LookupCost]:
    """Time reset() and propose() at each context length; returns one LookupCost per length."""
    make, k = DRAFTERS[drafter_kind]
    stream = code_like_stream(max(lengths) + WARMUP + calls)
    rows = []
    for length in lengths:
        drafter = make()
        t0 = time.perf_counter()
        drafter.reset(stream[:length])
        index_s = time.perf_counter() - t0
        context = stream[:length]
        for tok in stream[length : length + WARMUP]:
            context.append(tok)
            drafter.propose(context, k)
        drafted = 0
        t0 = time.perf_counter()
        for tok in stream[length + WARMUP : length + WARMUP + calls]:
            context.append(tok)
            drafted += len(drafter.propose(context, k).tokens)
        propose_s = time.perf_counter() - t0
        rows.append(
            LookupCost(length, propose_s / calls * 1e6, index_s / length * 1e6, drafted / calls, _size(drafter))
        )
    return rows


def report(rows: list[LookupCost], drafter_kind: str = "ngram") -> str:
    """The cost table and its share of a target decode step."""
    title = (
        f"N-gram drafter (N=5, K={DEFAULT_K['ngram']})"
        if drafter_kind == "ngram"
        else f"suffix drafter (K={DEFAULT_K['suffix']})"
    )
    size = "table keys" if drafter_kind == "ngram" else "states"
    lines = [
        f"{title}, {CALLS} timed propose calls per length, target step {TARGET_STEP_MS:.0f} ms",
        f"{'context':>8} {'us/propose':>11} {'us/indexed tok':>15} {'% of step':>10} {'mean draft':>11} {size:>11}",
    ]
    for r in rows:
        share = r.us_per_propose / (TARGET_STEP_MS * 1e3) * 100
        lines.append(
            f"{r.context:>8} {r.us_per_propose:>11.1f} {r.us_per_indexed_token:>15.2f} "
            f"{share:>9.4f}% {r.mean_draft:>11.2f} {r.table_keys:>11}"
        )
    return "\n".join(lines)
