"""Long contexts: a drafter's round reads the new tokens, not the whole context (suffix, n-gram, a draft model), and
prompts prefill in chunks of PREFILL_STEP tokens."""

import random

import pytest
from conftest import long_context

from mlx_spec.gen import registry
from mlx_spec.gen.drafters.ngram import NGramDrafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter
from mlx_spec.gen.session import Session
from mlx_spec.gen.tunables import PREFILL_STEP
from mlx_spec.named import load_model

ROUNDS = 30


class Watched(list):
    """A context that counts the tokens read from it (by index, slice or iteration)."""

    read = 0

    def __getitem__(self, i):
        got = super().__getitem__(i)
        Watched.read += len(got) if isinstance(i, slice) else 1
        return got

    def __iter__(self):
        for t in super().__iter__():
            Watched.read += 1
            yield t


def code(n: int, seed: int = 0) -> list[int]:
    """n tokens of a text that repeats itself with edits, like code: lines from a small set, some changed."""
    rng = random.Random(seed)
    lines = [[rng.randrange(300) for _ in range(rng.randrange(4, 12))] for _ in range(40)]
    out = []
    while len(out) < n:
        line = list(rng.choice(lines))
        line[rng.randrange(len(line))] = rng.randrange(300)
        out += line
    return out[:n]


def reads_per_round(drafter, n: int) -> float:
    """Tokens a round of `drafter` reads at a context of n tokens: it proposes, then 3 tokens join the context."""
    context = Watched(code(n))
    drafter.reset(list(context))
    drafter.propose(context, 8)  # a draft model is fed the prompt at its first draft
    tail = code(ROUNDS * 3, seed=1)
    Watched.read = 0
    for i in range(ROUNDS):
        drafter.propose(context, 8)
        list.extend(context, tail[3 * i : 3 * i + 3])
    return Watched.read / ROUNDS


@pytest.mark.parametrize("kind", ["suffix", "ngram", "model"])
def test_a_round_of_a_drafter_reads_the_new_tokens_only(kind, tiny_models):
    if kind == "model":
        target, tok, _ = load_model(str(tiny_models["qwen2"]))
        draft = load_model(str(tiny_models["qwen2_draft"]))[0]
        make = lambda: registry.build("draft", target, tok, load=lambda _name: (draft, tok))  # noqa: E731
    else:
        make = {"suffix": SuffixDrafter, "ngram": NGramDrafter}[kind]
    deep = 4_000 if kind == "model" else 16_000  # (a draft model is fed the prompt first: on a CPU, 4k tokens is ~5 s)
    short, long = reads_per_round(make(), 1_000), reads_per_round(make(), deep)
    assert long <= short + 1 and long < 200  # the same work deep in the context as at 1k tokens: no rescan


@pytest.mark.parametrize("make", [SuffixDrafter, NGramDrafter], ids=["suffix", "ngram"])
def test_a_drafter_adopting_a_kept_prefix_indexes_the_rest_only_and_drafts_as_if_it_had_read_all(make):
    prefix, rest = code(16_000), code(600, seed=2)
    kept = make().fork(prefix)
    fresh, adopted = make(), make()
    adopted.reset(code(500, seed=3))  # another conversation's tables: replaced
    adopted.adopt(kept, len(prefix))
    Watched.read = 0
    adopted.reset(Watched(prefix + rest[:300]))
    assert Watched.read < 400  # the rest, not the 16k-token prefix again
    fresh.reset(prefix + rest[:300])
    for i in range(300, 600, 7):  # the same drafts as a drafter that read it all, as the context grows
        context = prefix + rest[:i]
        assert adopted.propose(context, 8).tokens.tolist() == fresh.propose(context, 8).tokens.tolist()
    again, other = make(), code(200, seed=4)  # the kept tables were copied, not grown by the first adopter
    again.adopt(kept, len(prefix))
    fresh = make()
    for d in (again, fresh):
        d.reset(prefix + other)
    assert again.propose(prefix + other, 8).tokens.tolist() == fresh.propose(prefix + other, 8).tokens.tolist()


def test_prompts_prefill_in_chunks(tiny_models, tmp_path):
    target, tok, _ = load_model(str(long_context(tiny_models["qwen2"], tmp_path / "t")))
    fed = []

    class Counting:
        def __init__(self, model):
            self._model = model

        def __call__(self, inputs, cache=None, **kw):
            fed.append(inputs.shape[-1])
            return self._model(inputs, cache=cache, **kw)

        def __getattr__(self, name):
            return getattr(self._model, name)

    session = Session(Counting(target), tok, registry.build("suffix", target, tok))
    ids = code(3 * PREFILL_STEP + 5)
    steps = list(session.prefill(ids))
    assert steps[-1] == (True, 0) and len(session.tokens) == len(ids) - 1
    assert max(fed) <= PREFILL_STEP and len(fed) >= 3  # never the whole prompt in one pass
