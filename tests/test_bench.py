"""Bench helpers: mlx-lm's acceptance rebuilt from its from_draft flags, and the prompt sets."""

from mlx_spec.bench.common import first_mismatch, rounds_from_flags
from mlx_spec.bench.prompts import PROSE_QUESTIONS, build

T, F = True, False


def test_rounds_from_flags_rebuilds_each_round():
    # k=3: [T T F] two accepted + correction; [F] none accepted; [T T T F] all three + bonus.
    r = rounds_from_flags([T, T, F, F, T, T, T, F], k=3, max_tokens=100)
    assert (r["rounds"], r["proposed"], r["accepted"]) == (3, 9, 5)
    assert r["proposed_by_position"] == [3, 3, 3] and r["accepted_by_position"] == [2, 2, 1]
    assert r["mean_accepted"] == 5 / 3 and r["draft_share"] == 5 / 8


def test_rounds_from_flags_near_max_tokens_and_at_eos():
    # max_tokens=4, k=3: round 1 proposes 3 (T T F: 3 tokens), round 2 may propose only 1 more token.
    r = rounds_from_flags([T, T, F, F], k=3, max_tokens=4)
    assert r["proposed_by_position"] == [2, 1, 1] and r["accepted_by_position"] == [1, 1, 0]
    # A run cut at an EOS inside the drafts: the unseen drafts of that round count as rejected.
    r = rounds_from_flags([T, T], k=3, max_tokens=100)
    assert (r["rounds"], r["proposed"], r["accepted"]) == (1, 3, 2)


def test_first_mismatch():
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 2, 3], [1, 5, 3]) == 1
    assert first_mismatch([1, 2], [1, 2, 3]) == 2


class _Tok:
    chat_template = None

    def encode(self, text):
        return [ord(c) % 50 for c in text[:20]]


def test_prompt_sets_are_interleaved():
    prompts = build(_Tok(), 0, 0, n_prose=3)
    assert [p.set for p in prompts] == ["prose"] * 3 and prompts[0].text == PROSE_QUESTIONS[0]
