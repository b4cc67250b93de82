"""The prefix cache: conversations sharing a system prompt start from a copy of its cache, within a byte bound, least
recently used out first; a hit gives plain decoding's tokens with every drafter; the server reports it in `usage`."""

import threading

import mlx.core as mx
import openai
import pytest
from conftest import long_context
from mlx_lm.generate import generate_step

from mlx_spec.gen import registry
from mlx_spec.gen.drafters.base import Draft, Drafter, Kept
from mlx_spec.gen.session import Session, Snapshot
from mlx_spec.gen.verify import common_prefix
from mlx_spec.named import load_model
from mlx_spec.server.app import build_app
from mlx_spec.server.main import Running
from mlx_spec.server.pair import Pair
from mlx_spec.server.pool import SessionPool
from mlx_spec.server.prefixes import MIN_SHARED, PrefixCache

SYSTEM = "You edit code. Tools: read(path), write(path, text), run(cmd). " + "".join(
    f"def f{i}(a, b):\n    return a + b * {i}\n" for i in range(24)
)
USERS = ["def add(a, b):", "class Point:", "import numpy as np", "for i in range(10):"]
N = 10  # tokens a reply


class Counting:
    """A model proxy that counts the tokens fed through it, or through its inner model (a drafter's split head)."""

    def __init__(self, model, fed=None):
        self._model, self._fed = model, fed if fed is not None else [0]

    @property
    def fed(self) -> int:
        return self._fed[0]

    def __call__(self, inputs, cache=None, **kw):
        self._fed[0] += inputs.shape[-1]
        return self._model(inputs, cache=cache, **kw)

    def __getattr__(self, name):
        got = getattr(self._model, name)
        return Counting(got, self._fed) if name == "model" else got


class Sized:
    """A cache layer of a given size (the store reads nothing else)."""

    def __init__(self, nbytes):
        self.nbytes = nbytes


def snap(tokens, nbytes):
    return Snapshot(list(tokens), [Sized(nbytes)], {})


@pytest.fixture(scope="module")
def folders(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("long")
    return long_context(tiny_models["qwen2"], root / "t"), long_context(tiny_models["qwen2_draft"], root / "d")


@pytest.fixture(scope="module")
def models(folders):
    target, tok, _ = load_model(str(folders[0]))
    draft, _, _ = load_model(str(folders[1]))
    return target, tok, draft


def ask(tok, user, replies=(), system=SYSTEM):
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    for r, u in replies:
        msgs += [{"role": "assistant", "content": r}, {"role": "user", "content": u}]
    return list(tok.apply_chat_template(msgs, add_generation_prompt=True))


def plain(model, ids, n=N):
    return [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=n)]


def text(pair, tokens):
    """The reply's text as the server detokenizes it."""
    detok = pair.tokenizer.detokenizer
    detok.reset()
    for t in tokens:
        detok.add_token(t)
    detok.finalize()
    return detok.text


def turn(pool, ids, **kw):
    """One request through the pool: (tokens, cached prompt tokens)."""
    session = pool.acquire(ids)
    events = list(session.generate(ids, max_tokens=N, eos_token_ids=[], **kw))
    pool.release(session)
    return [e.token for e in events], events[-1].stats.prompt_cached


def test_the_store_keeps_its_bound_and_evicts_the_least_recently_used():
    store = PrefixCache(max_bytes=250)
    a, b, c = ([k] * MIN_SHARED for k in (1, 2, 3))
    assert store.add(snap(a, 100)) and store.add(snap(b, 100))
    hit, n = store.find(a + [9, 9])
    assert hit.tokens == a and n == MIN_SHARED  # a is now the most recently used
    assert store.add(snap(c, 100))  # 300 bytes: the least recently used (b) goes, not a
    assert [k[0] for k in store.entries] == [1, 3] and store.nbytes == 200 <= store.max_bytes
    assert store.find(b + [9])[0] is None
    assert store.find(a[:-1] + [9])[0] is None  # fewer than MIN_SHARED tokens shared: not worth a copy
    assert not store.add(snap([4] * MIN_SHARED, 251)) and len(store) == 2  # alone past the bound: not kept
    assert store.add(snap(a + [5] * 10, 120))  # a longer prefix replaces its own prefix (a trimmed copy serves it)
    assert [k[0] for k in store.entries] == [3, 1] and store.nbytes == 220
    assert store.find(a + [6])[1] == MIN_SHARED  # served by the longer entry
    assert PrefixCache(0).add(snap(a, 1)) is False  # a bound of 0 keeps nothing


def test_a_second_conversation_starts_from_the_shared_prefix_and_the_first_keeps_its_own(models):
    target, tok = models[:2]
    a1, b1, c1 = (ask(tok, u) for u in USERS[:3])
    shared = common_prefix(a1, b1)
    assert shared > 200

    def run(store):
        pool = SessionPool(lambda: Session(target, tok, None), limit=4, prefixes=store)
        out_a, cached_a1 = turn(pool, a1)
        _, cached_b1 = turn(pool, b1)
        a2 = ask(tok, USERS[0], [(tok.decode(out_a), "and sub?")])
        _, cached_a2 = turn(pool, a2)
        _, cached_c1 = turn(pool, c1)
        return cached_a1, cached_b1, cached_a2, cached_c1, len(a1)

    cached_a1, cached_b1, cached_a2, cached_c1, n_a1 = run(PrefixCache())
    assert cached_a1 == 0 and cached_b1 == shared and cached_c1 == shared
    assert cached_a2 >= n_a1  # conversation A's own session came back whole
    # Without the store, B takes A's session and cuts it back to the shared prefix: A's next turn lost its own.
    assert run(None)[2] < n_a1


@pytest.fixture(scope="module")
def two_users(models):
    """The first two users' prompts and their plain greedy replies, decoded once for every drafter."""
    target, tok, _ = models
    asks = [ask(tok, u) for u in USERS[:2]]
    return asks, [plain(target, a) for a in asks]


@pytest.mark.parametrize("spec", ["none", "suffix", "ngram", "MODEL", "hybrid:MODEL"])
def test_greedy_output_with_a_prefix_hit_equals_plain_decoding(models, two_users, spec):
    target, tok, draft = models
    (a1, b1), (plain_a, plain_b) = two_users
    counted = Counting(draft)

    def new_session():
        d = registry.build(spec.replace("MODEL", "draft"), target, tok, load=lambda _name: (counted, tok))
        return Session(target, tok, d, num_draft=3, adaptive=False)  # every round drafts

    pool = SessionPool(new_session, limit=4, prefixes=PrefixCache())
    out_a, cached = turn(pool, a1)
    assert out_a == plain_a and cached == 0
    before = counted.fed
    out_b, cached = turn(pool, b1)
    assert cached > 200 and out_b == plain_b
    if "MODEL" in spec:  # the draft model's cache came with the prefix: it was fed the rest, not the whole prompt
        assert 0 < counted.fed - before < len(b1) - cached + 4 * N


class Remembers(Drafter):
    """A lookup drafter of no known kind that declares a state to keep: the tokens a snapshot covers (drafts none)."""

    name = "remembers"

    def __init__(self):
        self.adopted: list[int] | None = None

    def propose(self, context, k, sampler=None):
        return Draft.of([])

    def fork(self, tokens):
        return Kept(self.name, list(tokens), nbytes=8)

    def adopt(self, kept, n):
        if kept.key == self.name:
            self.adopted = kept.state[:n]


def test_a_drafter_that_declares_a_state_to_keep_gets_it_back_with_a_kept_prefix(models):
    target, tok = models[:2]
    ids = ask(tok, USERS[0])
    first = Session(target, tok, Remembers())
    list(first.prefill(ids))
    snap = first.snapshot(100)
    assert snap is not None and snap.kept["remembers"].state == ids[:100]
    assert snap.nbytes == sum(c.nbytes for c in snap.cache) + 8  # its memory counts toward the store's bound
    drafter = Remembers()
    second = Session(target, tok, drafter)
    second.adopt(snap, 60)
    list(second.prefill(ids))
    assert drafter.adopted == ids[:60]
    plain_drafter = Session(target, tok, Drafter())  # one that declares nothing keeps nothing
    list(plain_drafter.prefill(ids))
    assert plain_drafter.snapshot(100).kept == {}


def test_caches_that_cannot_be_copied_keep_the_pool_as_it_was(tiny_models):
    target, tok, _ = load_model(str(tiny_models["gemma3"]))  # sliding-window layers: no copy of a prefix
    store = PrefixCache()
    pool = SessionPool(lambda: Session(target, tok, None), limit=4, prefixes=store)
    a1, b1 = (ask(tok, u, system=SYSTEM[:300]) for u in USERS[:2])
    assert common_prefix(a1, b1) > MIN_SHARED  # enough to keep, were it copyable
    assert turn(pool, a1)[0] == plain(target, a1) and turn(pool, b1)[0] == plain(target, b1)
    assert len(store) == 0 and pool.total == 1  # B took A's session, as without a store


@pytest.fixture(scope="module")
def server(folders):
    pair = Pair.load(str(folders[0]), "suffix")
    with Running(build_app(pair, max_concurrency=3, max_tokens=N)) as srv:
        yield srv, pair


def test_server_reports_cached_tokens_and_concurrent_requests_equal_their_solo_runs(server):
    srv, pair = server
    client = openai.OpenAI(base_url=srv.url + "v1", api_key="unused", max_retries=0, timeout=120)
    msgs = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": u}] for u in USERS]
    ids = [pair.chat_ids(m) for m in msgs]
    shared = common_prefix(ids[0], ids[1])
    first = client.chat.completions.create(model="tiny", messages=msgs[0], temperature=0)
    second = client.chat.completions.create(model="tiny", messages=msgs[1], temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == shared
    replies = [None] * len(msgs)

    def go(i):
        replies[i] = client.chat.completions.create(model="tiny", messages=msgs[i], temperature=0)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(msgs))]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    for i, r in enumerate(replies):
        assert r.choices[0].message.content == text(pair, plain(pair.target, ids[i])), f"request {i}"
        assert r.usage.prompt_tokens_details.cached_tokens >= shared
