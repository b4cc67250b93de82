"""Every model type of the installed mlx-lm, as a tiny seeded model: plain mlx-spec gives mlx-lm's greedy tokens, and
every drafter gives them too, alone and batched, across a sliding window and past it, drafting where the prompt repeats
itself, or is refused in one line before the first token; sampling keeps the target's law past a window and in a MoE.
The families of QUICK run in the quick tier, every other type (and the sampling test) in the slow one; half the types
run here, half in test_conformance_b.py."""

import pytest
from conformance import installed_types, model
from conformance_models import CANNOT_LOAD, CONFIGS, QUICK
from conformance_suite import suite
from conftest import REPEATING, check

from mlx_spec.gen.drafters.ngram import NGramDrafter

TYPES = installed_types()


CONFIGURED = [k for k in TYPES if k in CONFIGS]


def test_every_installed_type_has_a_configuration():
    missing = [k for k in TYPES if k not in CONFIGS and k not in CANNOT_LOAD]
    assert not missing, f"mlx-lm model types with no configuration in tests/conformance_models.py: {missing}"
    assert set(QUICK) <= set(TYPES), f"quick families not in the installed mlx-lm: {set(QUICK) - set(TYPES)}"


# every other type here, the rest in test_conformance_b.py: pytest-xdist runs the two files on two workers
test_plain_equals_mlx_lm, test_drafter_alone_equals_mlx_lm, test_drafter_batched_equals_mlx_lm = suite(CONFIGURED[0::2])


@pytest.mark.slow  # 800 samples of each
@pytest.mark.parametrize("kind", ["gemma3_text", "qwen3_moe"])  # a sliding window of 4 (the prompt is 8); a MoE
def test_sampling_keeps_the_law(kind):
    target = model(kind, vocab_size=4, sliding_window=4)
    ok, stat, crit = check(target, NGramDrafter(), dict(temp=1.0), REPEATING)
    assert ok, f"chi2={stat:.1f} >= {crit:.1f}"
