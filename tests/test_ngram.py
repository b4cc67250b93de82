"""The ANPD n-gram drafter, seen through its drafts: table building, multi-level fallback, incremental indexing,
limits."""

import random

import pytest

from mlx_spec.errors import GenerationError
from mlx_spec.gen.drafters.ngram import NGramDrafter
from mlx_spec.gen.registry import default_num_draft


def test_defaults_follow_paper():
    d = NGramDrafter()
    assert (d.n, d.min_n, default_num_draft(d)) == (5, 2, 7)  # ANPD: N = 5, K = 7, bigrams at the bottom


def fresh(context, k, **kw):
    """The draft of a drafter that never saw anything but `context`."""
    return NGramDrafter(**kw).propose(context, k).tokens.tolist()


def test_table_built_from_prompt():
    d = NGramDrafter(n=3)
    d.reset([1, 2, 3, 1, 2])
    # Context == prompt: nothing new to index, and the draft continues the repeated motif.
    assert d.propose([1, 2, 3, 1, 2], 4).tokens.tolist() == [3, 1, 2, 3]
    assert d.propose([1, 2, 3, 1, 2], 4).probs is None
    # The bigrams were indexed too: the key (7, 1) never occurred, but (1,) did, both times followed by 2.
    assert d.propose([1, 2, 3, 1, 2, 7, 1], 1).tokens.tolist() == [2]


def test_multilevel_fallback_to_bigram():
    # The 4-gram key (7, 8, 9) never occurred, nor (8, 9); only the bigram key (9,) did.
    d = NGramDrafter(n=4)
    d.reset([9, 42, 5, 6])
    assert d.propose([9, 42, 5, 6, 7, 8, 9], 1).tokens.tolist() == [42]


def test_longest_match_preferred():
    # Bigram (3,) -> 50 is the most frequent, but the 4-gram key (1, 2, 3) -> 40 is more specific.
    prompt = [3, 50, 3, 50, 3, 50, 1, 2, 3, 40, 0]
    d = NGramDrafter(n=4)
    d.reset(prompt)
    assert d.propose(prompt + [1, 2, 3], 1).tokens.tolist() == [40]
    d2 = NGramDrafter(n=2)  # bigram only: frequency decides
    d2.reset(prompt)
    assert d2.propose(prompt + [1, 2, 3], 1).tokens.tolist() == [50]


def test_most_frequent_wins_ties_go_to_most_recent():
    d = NGramDrafter(n=2)
    d.reset([5, 1, 5, 1, 5, 2])
    assert d.propose([5, 1, 5, 1, 5, 2, 5], 1).tokens.tolist() == [1]  # 5->1 twice beats 5->2 once
    d.reset([5, 1, 5, 2])
    assert d.propose([5, 1, 5, 2, 5], 1).tokens.tolist() == [2]  # 1:1 tie, most recent wins


def test_incremental_equals_from_scratch():
    """Fed a growing context a few tokens at a time, the drafter drafts at every step what one built from scratch
    on the same context drafts."""
    rng = random.Random(0)
    motifs = [[rng.randrange(30) for _ in range(rng.randrange(3, 9))] for _ in range(6)]
    seq = [t for _ in range(60) for t in rng.choice(motifs) + [rng.randrange(30)]]
    inc = NGramDrafter()
    inc.reset(seq[:20])
    pos, drafted = 20, 0
    while pos < len(seq):  # grow by 1..8 tokens per step, like accepted runs
        pos = min(len(seq), pos + rng.randrange(1, 9))
        draft = inc.propose(seq[:pos], 7).tokens.tolist()
        assert draft == fresh(seq[:pos], 7), pos
        drafted += len(draft)
    assert drafted > 100  # the steps drafted, so there was something to disagree on


def test_drafts_do_not_enter_the_table():
    """A rejected draft leaves no trace: afterwards the drafter drafts what one that never drafted does."""
    ctx = [2, 7, 5, 2, 7, 5, 1, 2, 3, 6, 1, 2]  # (1, 2) -> 3 once; (2,) -> 7 twice, -> 3 once
    d = NGramDrafter(n=3)
    d.reset(ctx)
    assert d.propose(ctx, 1).tokens.tolist() == [3]
    # The target said 9 instead of 3, then 2. Had the drafted 3 been counted, (2,) -> 3 would tie 7 and, as the
    # more recent, win the bigram lookup below.
    grown = ctx + [9, 2]
    assert d.propose(grown, 3).tokens.tolist() == fresh(grown, 3, n=3) == [7, 5, 1]


def test_reindex_when_context_rewritten():
    d = NGramDrafter(n=3)
    d.reset([1, 2, 3, 4, 1, 2])
    assert d.propose([1, 2, 3, 4, 1, 2], 3).tokens.tolist() == [3, 4, 1]
    rewritten = [7, 8, 9, 7, 8]  # a new turn replaced the context: old n-grams must be gone
    assert d.propose(rewritten, 3).tokens.tolist() == [9, 7, 8]
    assert d.propose(rewritten + [1, 2], 3).tokens.tolist() == []  # (1, 2) -> 3 was the old context's
    # Shorter than what was indexed (e.g. truncated) also re-indexes: (7, 8) -> 9 went with the 9.
    assert d.propose([7, 8], 3).tokens.tolist() == []
    for ctx in ([7, 8, 7], [7, 8, 7, 8, 5, 7]):  # later tokens extend the truncated context
        assert d.propose(ctx, 3).tokens.tolist() == fresh(ctx, 3, n=3)


def test_no_match_returns_empty():
    d = NGramDrafter()
    d.reset([1, 2, 3, 4])
    assert d.propose([1, 2, 3, 4, 99], 7).tokens.tolist() == []
    assert NGramDrafter().propose([], 7).tokens.tolist() == []


def test_k_caps_the_draft():
    prompt = [1, 2] * 20
    d = NGramDrafter(n=3)
    d.reset(prompt)
    assert len(d.propose(prompt, 100).tokens.tolist()) == 100  # the chain goes on as long as it is asked
    assert d.propose(prompt, 3).tokens.tolist() == [1, 2, 1]
    assert d.propose(prompt, 0).tokens.tolist() == []


def test_chains_through_its_own_draft():
    # Each drafted token is queried from context+draft (paper Alg 1 lines 12-16).
    d = NGramDrafter(n=2)
    d.reset([10, 11, 12, 13, 10])
    assert d.propose([10, 11, 12, 13, 10], 6).tokens.tolist() == [11, 12, 13, 10, 11, 12]


def test_learning_leaves_trusted_levels_alone():
    d = NGramDrafter()
    d.reset([1, 2, 1, 2])
    before = d.propose([1, 2, 1, 2], 7).tokens.tolist()
    d.learn(7, 3)
    assert d.propose([1, 2, 1, 2], 7).tokens.tolist() == before


def test_proposing_is_free_of_side_effects():
    d = NGramDrafter()
    ctx = [1, 2, 3, 1, 2, 3, 1, 2]
    d.reset(ctx)
    drafts = [d.propose(ctx, 7).tokens.tolist() for _ in range(5)]
    assert drafts[0] == drafts[-1] and drafts[0]
    assert d.propose([9, 8], 3).tokens.tolist() == []


def test_untrusted_level_stops_drafting_and_recovers():
    d = NGramDrafter()
    ctx = [5, 9, 7, 1, 5, 9]  # the longest match is the trigram (5, 9) -> 7
    d.reset(ctx)
    for _ in range(8):  # that level keeps getting rejected: 0.8^8 = 0.17 < 0.2
        assert d.propose(ctx, 1).tokens.tolist() == [7]
        d.learn(1, 0)
    ctx = [0] + ctx  # not an extension: the table is rebuilt, and what was learnt of each level is kept
    for _ in range(20):  # asking again and again changes nothing: only new context earns a retry
        assert d.propose(ctx, 1).tokens.tolist() == []
    grown, steps = list(ctx), 0
    while not d.propose(grown, 1).tokens.tolist():  # each call with new tokens gives the level back a little trust
        grown += [100 + steps, 5, 9]  # a token never seen, then the trigram's key again
        steps += 1
        assert steps < 100
    assert steps >= 1


def test_min_trust_zero_is_the_papers_drafter():
    d = NGramDrafter(min_trust=0.0)
    ctx = [5, 9, 7, 1, 5, 9]
    d.reset(ctx)
    for _ in range(10):
        d.propose(ctx, 1)
        d.learn(1, 0)
    assert d.propose(ctx, 1).tokens.tolist() == [7]


def _reference_draft(seq, n, k, min_n=2):
    """The paper's algorithm by brute-force scans: most frequent continuation, ties to most recent."""
    out = []
    for _ in range(k):
        window = seq + out
        tok = None
        for m in range(min(n, len(window) + 1), min_n - 1, -1):
            key = window[len(window) - m + 1 :]
            counts, last = {}, {}
            for i in range(m - 1, len(seq)):  # only real context is indexed, never the draft
                if seq[i - m + 1 : i] == key:
                    counts[seq[i]] = counts.get(seq[i], 0) + 1
                    last[seq[i]] = i
            if counts:
                tok = max(counts, key=lambda t: (counts[t], last[t]))
                break
        if tok is None:
            break
        out.append(tok)
    return out


def test_matches_brute_force_reference():
    rng = random.Random(1)
    for _ in range(400):
        n, k = rng.randrange(2, 9), rng.randrange(1, 9)
        seq = [rng.randrange(4) for _ in range(rng.randrange(0, 30))]
        d = NGramDrafter(n=n)
        d.reset(seq[: len(seq) // 2])
        assert d.propose(seq, k).tokens.tolist() == _reference_draft(seq, n, k), (seq, n, k)


@pytest.mark.parametrize("kwargs", [dict(n=1), dict(n=0), dict(n=3, min_n=4), dict(min_n=1)])
def test_bad_args_raise(kwargs):
    with pytest.raises(GenerationError):
        NGramDrafter(**kwargs)
