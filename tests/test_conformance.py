"""Every model type of the installed mlx-lm, as a tiny seeded model: plain mlx-spec gives mlx-lm's greedy tokens, and
every drafter gives them too, alone and batched, across a sliding window and past it, drafting where the prompt repeats
itself, or is refused in one line before the first token; sampling keeps the target's law past a window and in a MoE.
The families of QUICK run in the quick tier, every other type (and the sampling test) in the slow one."""

import pytest
from conformance import (
    DRAFTERS,
    NEVER_REFUSED,
    PROMPTS,
    Alone,
    Refused,
    alone,
    batched,
    differs,
    installed_types,
    model,
    plain,
    problems,
)
from conformance_models import CANNOT_LOAD, CONFIGS, QUICK
from conftest import REPEATING, check

from mlx_spec.gen.drafters.ngram import NGramDrafter

TYPES = installed_types()


def tiers(kinds, *rest):
    """Params of each kind (with each of `rest`): the quick families unmarked, the rest slow, those that cannot load
    on this machine skipped with the reason."""
    out = []
    for kind in kinds:
        marks = [] if kind in QUICK else [pytest.mark.slow]
        if kind in CANNOT_LOAD:
            marks.append(pytest.mark.skip(reason=f"{kind}: {CANNOT_LOAD[kind]}"))
        out += [pytest.param(kind, *r, marks=marks, id="-".join((kind, *r))) for r in (rest or [()])]
    return out


CONFIGURED = [k for k in TYPES if k in CONFIGS]


def test_every_installed_type_has_a_configuration():
    missing = [k for k in TYPES if k not in CONFIGS and k not in CANNOT_LOAD]
    assert not missing, f"mlx-lm model types with no configuration in tests/conformance_models.py: {missing}"
    assert set(QUICK) <= set(TYPES), f"quick families not in the installed mlx-lm: {set(QUICK) - set(TYPES)}"


@pytest.mark.parametrize("kind", tiers(CONFIGURED))
def test_plain_equals_mlx_lm(kind):
    assert [d for p in PROMPTS if (d := differs(kind, p, plain(kind, p)))] == []


def refused_in_one_line(spec: str, e: Refused) -> None:
    assert spec not in NEVER_REFUSED, f"{spec} must run wherever plain decoding does, got: {e}"
    assert str(e) and "\n" not in str(e), f"a refusal is one line: {e!r}"


@pytest.mark.parametrize("kind, spec", tiers(CONFIGURED, *[(d,) for d in DRAFTERS]))
def test_drafter_alone_equals_mlx_lm(kind, spec):
    try:
        runs = {p: alone(kind, spec, p) for p in PROMPTS}
    except Refused as e:
        return refused_in_one_line(spec, e)
    assert problems(kind, spec, runs) == []


@pytest.mark.parametrize("kind, spec", tiers(CONFIGURED, *[(d,) for d in DRAFTERS]))
def test_drafter_batched_equals_mlx_lm(kind, spec):
    try:
        runs = batched(kind, spec)
    except Alone as e:  # whatever the drafter: the server runs each request alone, and says why once
        assert str(e) and "\n" not in str(e)
        return
    except Refused as e:
        return refused_in_one_line(spec, e)
    assert problems(kind, spec, runs, together=True) == []


@pytest.mark.slow  # 800 samples of each
@pytest.mark.parametrize("kind", ["gemma3_text", "qwen3_moe"])  # a sliding window of 4 (the prompt is 8); a MoE
def test_sampling_keeps_the_law(kind):
    target = model(kind, vocab_size=4, sliding_window=4)
    ok, stat, crit = check(target, NGramDrafter(), dict(temp=1.0), REPEATING)
    assert ok, f"chi2={stat:.1f} >= {crit:.1f}"
