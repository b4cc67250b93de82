"""The conformance tests over a list of model types, made per test file (`suite`): two files split the types so that
pytest-xdist runs them on two workers. The quick families run in the quick tier, every other type in the slow one."""

import pytest
from conformance import DRAFTERS, NEVER_REFUSED, PROMPTS, Alone, Refused, alone, batched, differs, plain, problems
from conformance_models import APART, CANNOT_LOAD, OPEN, QUICK


def tiers(kinds, *rest):
    """Params of each kind (with each of `rest`): the quick families unmarked, the rest slow, those that cannot load
    on this machine skipped with the reason, those with an open failure expected to fail."""
    out = []
    for kind in kinds:
        marks = [] if kind in QUICK else [pytest.mark.slow]
        if kind in CANNOT_LOAD:
            marks.append(pytest.mark.skip(reason=f"{kind}: {CANNOT_LOAD[kind]}"))
        if kind in OPEN:
            marks.append(pytest.mark.xfail(reason=f"{kind}: {OPEN[kind]}"))
        out += [pytest.param(kind, *r, marks=marks, id="-".join((kind, *r))) for r in (rest or [()])]
    return out


def refused_in_one_line(spec: str, e: Refused) -> None:
    assert spec not in NEVER_REFUSED, f"{spec} must run wherever plain decoding does, got: {e}"
    assert str(e) and "\n" not in str(e), f"a refusal is one line: {e!r}"


def suite(kinds: list[str]):
    """(plain equals mlx-lm, each drafter alone equals it, each drafter batched equals it) over `kinds`."""

    @pytest.mark.parametrize("kind", tiers(kinds))
    def test_plain_equals_mlx_lm(kind):
        assert [d for p in PROMPTS if (d := differs(kind, p, plain(kind, p)))] == []

    @pytest.mark.parametrize("kind, spec", tiers(kinds, *[(d,) for d in DRAFTERS]))
    def test_drafter_alone_equals_mlx_lm(kind, spec):
        try:
            runs = {p: alone(kind, spec, p) for p in PROMPTS}
        except Refused as e:
            return refused_in_one_line(spec, e)
        assert problems(kind, spec, runs) == []

    @pytest.mark.parametrize("kind, spec", tiers(kinds, *[(d,) for d in DRAFTERS]))
    def test_drafter_batched_equals_mlx_lm(kind, spec):
        try:
            runs = batched(kind, spec)
        except Alone as e:  # whatever the drafter: the server runs each request alone, and says why once
            assert str(e) and "\n" not in str(e)
            assert kind in APART, f"{kind}'s requests run alone: {e}"
            return
        except Refused as e:
            return refused_in_one_line(spec, e)
        assert problems(kind, spec, runs, together=True) == []

    return test_plain_equals_mlx_lm, test_drafter_alone_equals_mlx_lm, test_drafter_batched_equals_mlx_lm
