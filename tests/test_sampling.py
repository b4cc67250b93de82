"""Speculative sampling keeps the target's distribution: a chi-square test that a broken rule fails."""

import mlx.core as mx
import pytest
from conftest import (N_TOKENS, PROMPT, SAMPLES, V, check, chi_square_pvalue_ok, exact_joint,
                      sample_pairs, tiny)
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from mlx_spec.gen import verify
from mlx_spec.gen.drafters.base import Draft, Drafter
from mlx_spec.gen.drafters.model import ModelDrafter
from mlx_spec.gen.sampling import make_probs_fn


@pytest.fixture(scope="module")
def pair():
    return tiny(1, 3.0), tiny(0, 1.5)  # a spread target and a draft that disagrees with it


class ConstantDrafter(Drafter):
    """Deterministic: always proposes token 0 (one-hot p), like the N-gram drafter."""

    def propose(self, context, k, probs_fn=None, source=None):
        return Draft([0] * k)


SETTINGS = [dict(temp=1.0), dict(temp=0.7, top_k=3), dict(temp=1.3, top_p=0.9)]


@pytest.mark.parametrize("kw", SETTINGS)
def test_model_drafter_sampling_matches_target(pair, kw):
    target, draft = pair
    ok, stat, crit = check(target, ModelDrafter(draft, V, min_confidence=0.0), kw)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


def test_a_pipelined_model_drafter_sampling_matches_target(pair):
    """Its next pass is launched on the sampled token before the host reads it: the same law."""
    target, draft = pair
    ok, stat, crit = check(target, ModelDrafter(draft, V, min_confidence=0.0, pipeline=True), dict(temp=0.7, top_k=3))
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


def test_a_padded_verify_pass_keeps_the_target_law(pair):
    """Every verify pass padded with dummy positions (trimmed at once): the same law."""
    from test_speculative import Padding

    target, draft = pair
    drafter = ModelDrafter(draft, V, min_confidence=0.0)
    ok, stat, crit = check(target, drafter, dict(temp=1.0), policy=Padding(2, adaptive=False))
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


def test_deterministic_drafter_sampling_matches_target(pair):
    target, _ = pair
    ok, stat, crit = check(target, ConstantDrafter(), dict(temp=1.0))
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


def test_plain_mlx_lm_sampler_matches_the_same_law(pair):
    """Our probs_fn is the law mlx-lm's sampler draws from (so 'plain' means mlx-lm's plain)."""
    target, _ = pair
    kw = dict(temp=0.7, top_k=3)
    joint = exact_joint(target, make_probs_fn(**kw))
    sampler = make_sampler(**kw)
    counts = sample_pairs(lambda: [int(t) for t, _ in generate_step(mx.array(PROMPT), target, max_tokens=N_TOKENS,
                                                                    sampler=sampler)], SAMPLES)
    ok, stat, crit = chi_square_pvalue_ok(counts, joint, SAMPLES)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


def _wrong_row(target_probs, draft, draft_probs):
    """verify_sampling with one bug: on a rejection at position a it resamples from row a+1's residual."""
    n = len(draft)
    if n == 0:
        return 0, verify.sample(target_probs[0]).item()
    p = draft_probs
    idx = mx.array(draft)[:, None]
    q_x = mx.take_along_axis(target_probs[:n], idx, axis=-1)[:, 0]
    p_x = mx.take_along_axis(p, idx, axis=-1)[:, 0]
    accept = (mx.random.uniform(shape=(n,)) * p_x < q_x).tolist()
    a = next((i for i, ok in enumerate(accept) if not ok), n)
    if a == n:
        return n, verify.sample(target_probs[n]).item()
    return a, verify.sample(verify._residual(target_probs[a + 1], p[a])).item()


@pytest.mark.parametrize("broken", ["resample_from_target", "always_accept", "residual_from_wrong_row"])
def test_a_broken_acceptance_rule_fails_the_same_test(pair, monkeypatch, broken):
    target, draft = pair
    if broken == "resample_from_target":
        monkeypatch.setattr(verify, "_residual", lambda q, p: q)  # forgets to subtract the draft
    elif broken == "always_accept":
        real = verify.verify_sampling

        def always(target_probs, tokens, draft_probs):
            return real(target_probs, tokens, None if draft_probs is None else draft_probs * 0 + 1e-9)

        monkeypatch.setattr("mlx_spec.gen.engine.verify_sampling", always)  # q/p huge: accepts every draft
    else:
        monkeypatch.setattr("mlx_spec.gen.engine.verify_sampling", _wrong_row)
    ok, stat, crit = check(target, ModelDrafter(draft, V, min_confidence=0.0), dict(temp=1.0))
    assert not ok, f"broken rule {broken} passed: chi2 {stat:.1f} < {crit:.1f}"


def test_verify_sampling_all_accepted_and_rejected_paths():
    q = mx.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert verify.verify_sampling(q, [1, 2], None) == (2, 0)  # all accepted, bonus from the last row
    assert verify.verify_sampling(q, [0, 2], None) == (0, 1)  # q(0)=0 rejects; residual is q's mass
