"""Microbenchmark: the N-gram drafter's lookup + indexing cost vs context length (`mlx-spec bench ngram-cost`)."""

import random
import time
from dataclasses import dataclass
from typing import List, Sequence

from ..gen.drafters.ngram import DEFAULT_K, NGramDrafter

CONTEXT_LENGTHS = (1_024, 8_192, 32_768, 131_072)  # 1k..128k tokens: prompt sizes up to long-context use
CALLS = 2_000  # timed propose calls per length; each adds one token, like a step accepting nothing
WARMUP = 100  # untimed calls first, so first-touch costs don't count
VOCAB = 32_000  # a typical BPE vocabulary size
TARGET_STEP_MS = 200.0  # the decode step we compare against: a large target model on this machine


@dataclass
class Row:
    """Cost at one context length."""

    context: int
    us_per_propose: float  # amortized, includes indexing the one new token
    us_per_indexed_token: float  # reset(prompt) time / prompt length
    mean_draft: float  # mean draft length over the timed calls
    table_keys: int


def code_like_stream(n: int, seed: int = 0) -> List[int]:
    """Tokens of repeated code-like motifs (keywords, idioms) with fresh identifiers mixed in."""
    rng = random.Random(seed)
    motifs = [[rng.randrange(VOCAB) for _ in range(rng.randrange(3, 25))] for _ in range(400)]
    weights = [1.0 / (i + 1) for i in range(len(motifs))]  # Zipf-like: a few idioms dominate
    out: List[int] = []
    while len(out) < n:
        out.extend(rng.choices(motifs, weights)[0])
        out.extend(rng.randrange(VOCAB) for _ in range(rng.randrange(0, 4)))  # identifiers, literals
    return out[:n]


def run(lengths: Sequence[int] = CONTEXT_LENGTHS, calls: int = CALLS) -> List[Row]:
    """Time reset() and propose() at each context length; returns one Row per length."""
    stream = code_like_stream(max(lengths) + WARMUP + calls)
    rows = []
    for length in lengths:
        drafter = NGramDrafter()
        t0 = time.perf_counter()
        drafter.reset(stream[:length])
        index_s = time.perf_counter() - t0
        context = stream[:length]
        for tok in stream[length : length + WARMUP]:
            context.append(tok)
            drafter.propose(context, DEFAULT_K)
        drafted = 0
        t0 = time.perf_counter()
        for tok in stream[length + WARMUP : length + WARMUP + calls]:
            context.append(tok)
            drafted += len(drafter.propose(context, DEFAULT_K).tokens)
        propose_s = time.perf_counter() - t0
        rows.append(Row(length, propose_s / calls * 1e6, index_s / length * 1e6, drafted / calls, len(drafter._counts)))
    return rows


def report(rows: List[Row]) -> str:
    """The cost table and its share of a target decode step."""
    lines = [f"N-gram drafter (N=5, K={DEFAULT_K}), {CALLS} timed propose calls per length, target step {TARGET_STEP_MS:.0f} ms",
             f"{'context':>8} {'us/propose':>11} {'us/indexed tok':>15} {'% of step':>10} {'mean draft':>11} {'table keys':>11}"]
    for r in rows:
        share = r.us_per_propose / (TARGET_STEP_MS * 1e3) * 100
        lines.append(f"{r.context:>8} {r.us_per_propose:>11.1f} {r.us_per_indexed_token:>15.2f} "
                     f"{share:>9.4f}% {r.mean_draft:>11.2f} {r.table_keys:>11}")
    return "\n".join(lines)
