"""Speculative sampling keeps the target's distribution: a chi-square test that a broken rule fails."""

import mlx.core as mx
import pytest
from conftest import (
    N_TOKENS,
    PROMPT,
    REPEATING,
    SAMPLES,
    V,
    check,
    chi_square_pvalue_ok,
    exact_joint,
    sample_pairs,
    tiny,
)
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from mlx_spec.gen import verify
from mlx_spec.gen.drafters.base import Draft, Drafter
from mlx_spec.gen.drafters.hybrid import HybridDrafter
from mlx_spec.gen.drafters.model import ModelDrafter
from mlx_spec.gen.drafters.ngram import NGramDrafter
from mlx_spec.gen.drafters.self_draft import QuantSelfDrafter, SelfDrafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter
from mlx_spec.gen.sampling import Sampler


@pytest.fixture(scope="module")
def pair():
    return tiny(1, 3.0), tiny(0, 1.5)  # a spread target and a draft that disagrees with it


class ConstantDrafter(Drafter):
    """Deterministic: always proposes token 0 (one-hot p), like the N-gram drafter."""

    name, free = "constant", True

    def propose(self, context, k, probs_fn=None):
        return Draft.of([0] * k, source=self.name)


SLOW = pytest.mark.slow
# quick: temperature alone; top-k and top-p in the full run (800 samples each)
SETTINGS = [
    dict(temp=1.0),
    pytest.param(dict(temp=0.7, top_k=3), marks=SLOW),
    pytest.param(dict(temp=1.3, top_p=0.9), marks=SLOW),
]


@pytest.mark.parametrize("kw", SETTINGS)
def test_model_drafter_sampling_matches_target(pair, kw):
    target, draft = pair
    ok, stat, crit = check(target, ModelDrafter(draft, V), kw)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


# quick: the context drafters and the hybrid; the target's own layers and its quantized copy in the full run
@pytest.mark.parametrize(
    "name", [pytest.param("self", marks=SLOW), pytest.param("quant-self", marks=SLOW), "ngram", "suffix", "hybrid"]
)
def test_every_drafter_sampling_matches_target(pair, name):
    """Self drafts (a layer of the target, its sampled law), a quantized copy, the context drafters (deterministic,
    on a prompt they draft from) and a hybrid of them: the target's law."""
    target, draft = pair
    if name in ("self", "quant-self"):  # a target of two layers, one of which drafts
        target = tiny(1, 2.0, layers=2)
    make = {
        "self": lambda: SelfDrafter(target, [1], V),
        "quant-self": lambda: QuantSelfDrafter(target, "int8", V),
        "ngram": NGramDrafter,
        "suffix": SuffixDrafter,
        "hybrid": lambda: HybridDrafter([SuffixDrafter(), NGramDrafter()], ModelDrafter(draft, V)),
    }[name]
    prompt = REPEATING if name in ("ngram", "suffix", "hybrid") else PROMPT
    ok, stat, crit = check(target, make(), dict(temp=1.0), prompt)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


def test_plain_sampling_queued_ahead_matches_target(pair):
    """No drafter: each next step is queued on the sampled token before the host reads it; the same law."""
    target, _ = pair
    ok, stat, crit = check(target, None, dict(temp=0.7, top_k=3), drafts=0)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


@pytest.mark.slow  # a chi-square law
def test_a_padded_verify_pass_keeps_the_target_law(pair):
    """Every verify pass padded with dummy positions (trimmed at once): the same law."""
    from test_speculative import Padding

    target, draft = pair
    ok, stat, crit = check(target, ModelDrafter(draft, V), dict(temp=1.0), planner=Padding(adaptive=False))
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


def test_deterministic_drafter_sampling_matches_target(pair):
    target, _ = pair
    ok, stat, crit = check(target, ConstantDrafter(), dict(temp=1.0))
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


@pytest.mark.slow  # a chi-square law
def test_plain_mlx_lm_sampler_matches_the_same_law(pair):
    """Our `Sampler.probs` is the law mlx-lm's sampler draws from (so 'plain' means mlx-lm's plain)."""
    target, _ = pair
    kw = dict(temp=0.7, top_k=3)
    joint = exact_joint(target, Sampler(**kw).probs)
    sampler = make_sampler(**kw)
    counts = sample_pairs(
        lambda: [int(t) for t, _ in generate_step(mx.array(PROMPT), target, max_tokens=N_TOKENS, sampler=sampler)],
        SAMPLES,
    )
    ok, stat, crit = chi_square_pvalue_ok(counts, joint, SAMPLES)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


@pytest.mark.parametrize(  # quick: the classic mistake; the other broken rules in the full run
    "broken",
    [
        "resample_from_target",
        pytest.param("always_accept", marks=pytest.mark.slow),
        pytest.param("residual_from_wrong_row", marks=pytest.mark.slow),
        pytest.param("bonus_from_the_last_draft_row", marks=pytest.mark.slow),
    ],
)
def test_a_broken_acceptance_rule_fails_the_same_test(pair, monkeypatch, broken):
    target, draft = pair
    real = verify.sampling_targets
    if broken == "resample_from_target":
        monkeypatch.setattr(verify, "_residual", lambda q, p: q)  # forgets to subtract the draft
    elif broken == "always_accept":  # q/p huge: accepts every draft
        monkeypatch.setattr("mlx_spec.gen.verify.sampling_targets", lambda q, d, p: real(q, d, p * 0 + 1e-9))
    elif broken == "residual_from_wrong_row":  # on a rejection at a, resamples from row a+1's residual

        def wrong(q, d, p):
            accept, candidates = real(q, d, p)
            shifted = verify.sample(verify._residual(mx.concatenate([q[1:-1], q[-1:]]), p))
            return accept, mx.concatenate([shifted, candidates[-1:]])

        monkeypatch.setattr("mlx_spec.gen.verify.sampling_targets", wrong)
    else:  # all accepted: the bonus drawn from the last draft position's row, not the row after it

        def wrong(q, d, p):
            accept, candidates = real(q, d, p)
            return accept, mx.concatenate([candidates[:-1], verify.sample(q[-2:-1])])

        monkeypatch.setattr("mlx_spec.gen.verify.sampling_targets", wrong)
    # 400 samples: each broken rule's chi-square is 103 (resample_from_target) to 64,000 against 24.5
    ok, stat, crit = check(target, ModelDrafter(draft, V), dict(temp=1.0), n=SAMPLES // 2)
    assert not ok, f"broken rule {broken} passed: chi2 {stat:.1f} < {crit:.1f}"


def test_verify_sampling_all_accepted_and_rejected_paths():
    q = mx.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])

    def verify_sampling(draft):
        accept, candidates = verify.sampling_targets(q, mx.array(draft, dtype=mx.uint32), None)
        return verify.accept_sampling(accept.tolist(), candidates.tolist())

    assert verify_sampling([1, 2]) == (2, 0)  # all accepted, bonus from the last row
    assert verify_sampling([0, 2]) == (0, 1)  # q(0)=0 rejects; residual is q's mass
