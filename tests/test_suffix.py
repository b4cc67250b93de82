"""The suffix drafter's automaton against brute force, and its drafting rules."""

import random

import pytest

from mlx_spec.gen.drafters.suffix import ALPHA, SuffixDrafter, SuffixIndex


def occurrences(text, s):
    return sum(1 for i in range(len(text) - len(s) + 1) if text[i : i + len(s)] == s)


def walk(index, s):
    v = 0
    for t in s:
        v = index.next[v].get(t)
        if v is None:
            return None
    return v


@pytest.mark.parametrize("seed", range(5))
def test_automaton_counts_every_substring_exactly(seed):
    rng = random.Random(seed)
    text = [rng.randrange(3) for _ in range(60)]
    index = SuffixIndex()
    for t in text:
        index.extend(t)
    for i in range(len(text)):
        for j in range(i + 1, min(len(text), i + 7) + 1):
            s = text[i:j]
            v = walk(index, s)
            assert v is not None and index.count[v] == occurrences(text, s), s
    assert walk(index, [7]) is None


@pytest.mark.parametrize("seed", range(5))
def test_match_is_the_longest_suffix_seen_before(seed):
    rng = random.Random(seed)
    text = [rng.randrange(4) for _ in range(80)]
    index = SuffixIndex()
    for n, t in enumerate(text, 1):
        index.extend(t)
        prefix = text[:n]
        best = max((L for L in range(1, n) if occurrences(prefix[:-1], prefix[n - L :]) > 0), default=0)
        assert index.match()[1] == best


def test_the_most_frequent_continuation_is_drafted():
    a, x = [1, 2, 3], [9]
    text = a + [5, 6] + x + a + [5, 6] + x + a + [8] + x + a
    d = SuffixDrafter()
    draft = d.propose(text, 8).tokens.tolist()
    assert draft[:2] == [5, 6]  # after 1 2 3: "5 6" twice, "8" once


def test_a_long_match_drafts_long_and_a_short_one_short():
    body = list(range(100, 140))
    d = SuffixDrafter()
    long = d.propose([1, 2] + body + [3] + body[:20], 24).tokens.tolist()
    assert long == (body[20:] + [3] + body)[:24]  # the copy goes on past the span, as it did before: k caps it
    short = SuffixDrafter().propose([5, 6, 50, 51, 52, 9, 9, 50, 51], 24).tokens.tolist()
    assert short == [52, 9, 9, 50][: int(ALPHA * 2)]  # a 2-token match drafts at most alpha * 2 tokens
    assert SuffixDrafter().propose([1, 2, 3, 4], 24).tokens.tolist() == []  # nothing seen before


def test_a_rewritten_context_is_indexed_again():
    d = SuffixDrafter()
    d.reset([1, 2, 3, 1, 2], None)
    assert d.propose([1, 2, 3, 1, 2], 4).tokens.tolist()[:1] == [3]
    assert d.propose([4, 5, 6, 4, 5], 4).tokens.tolist()[:1] == [6]  # not an extension: rebuilt
    assert d.index.tokens == [4, 5, 6, 4, 5]


@pytest.mark.parametrize("kind", ["ngram", "suffix"])
def test_the_cost_microbenchmark_runs_for_both_context_drafters(kind):
    from mlx_spec.bench import ngram as cost

    rows = cost.run(lengths=[2048], calls=100, drafter_kind=kind)
    assert len(rows) == 1 and rows[0].mean_draft > 0 and rows[0].table_keys > 0 and rows[0].us_per_propose > 0
    assert ("states" in cost.report(rows, kind)) == (kind == "suffix")
