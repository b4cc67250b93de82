"""Sampling through the server keeps the target's law on every API it speaks (/v1/chat/completions,
/v1/completions, /v1/responses, /v1/messages): N two-token replies at temperature > 0, with top-p and top-k, drafted
by a draft model whose law overlaps the target's (and by the suffix drafter), one request at a time and as
concurrent requests that share batched rounds, unseeded (speculative sampling) and with distinct seeds (Gumbel-max),
counted against the exact law of the target's first two tokens for the prompt the server builds (Pearson
chi-square).

Two tokens are enough: the first round drafts position 1 and verifies it, so the second token is its bonus or a
fresh round's. The broken rules it catches, patched into verify.py in the server's process: a rejected draft
resampled from the target q instead of the residual normalize(max(q - p, 0)); every draft accepted; and, seeded,
every draft taken for the row's own token."""

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import anthropic
import mlx.core as mx
import openai
import pytest
from conftest import chi_square_pvalue_ok, wait_for
from test_server_load import Slow, gated

from mlx_spec.gen import verify
from mlx_spec.gen.costs import Costs
from mlx_spec.gen.load import vocab_width
from mlx_spec.gen.sampling import Sampler
from mlx_spec.server.app import build_app
from mlx_spec.server.main import Running
from mlx_spec.server.pair import Pair

pytestmark = pytest.mark.slow  # chi-square laws over HTTP: 400 replies a case

N = 400  # replies per case: seconds of requests; cells of 1.25 % and more counted apart
WAVE = 8  # requests sent at once in a batched case
MAX_TOKENS = 2
ASK = [{"role": "user", "content": "def add(a, b):"}]
BLOCKS = 2  # the draft model's blocks: the target's first ones


@dataclass(frozen=True)
class SeenReply:
    """What a caller sees of a reply: its text, whether the model ended it (EOS) and the server's statistics."""

    text: str
    ended: bool
    stats: dict
    prompt_tokens: int


@dataclass(frozen=True)
class Case:
    """An API and the sampling options its requests send (seeded: request i with seed i); draft: the drafter they
    name (None: the server's), "suffix" on a prompt that repeats itself (`bait`)."""

    api: str
    temperature: float
    top_p: float | None = None
    top_k: int | None = None
    seeded: bool = False
    draft: str | None = None

    def probs_fn(self):
        """The target's law at each position under these options."""
        return Sampler(self.temperature, self.top_p or 0.0, self.top_k or 0).probs

    def __str__(self) -> str:
        options = dict(
            temp=self.temperature, top_p=self.top_p, top_k=self.top_k, seeded=self.seeded or None, draft=self.draft
        )
        return "-".join([self.api] + [f"{k}={v}" for k, v in options.items() if v is not None])


class Clients:
    """The official clients of one server, and the prompt's token ids (the completions API sends them as they are)."""

    def __init__(self, srv, ids: list[int]):
        self.openai = openai.OpenAI(base_url=srv.url + "v1", api_key="unused", max_retries=0, timeout=120)
        self.anthropic = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=120)
        self.ids = ids

    def ask(self, case: Case, i: int, ids: list[int]) -> SeenReply:
        """Request i of `case` (seeded: with seed i); the completions API sends `ids` as its prompt."""
        seed = i if case.seeded else None
        options = dict(top_k=case.top_k, draft=case.draft)  # OpenAI's clients know neither
        extra = {k: v for k, v in options.items() if v is not None}
        sampling = dict(temperature=case.temperature, top_p=case.top_p)
        if case.api == "chat":
            r = self.openai.chat.completions.create(
                model="tiny", messages=ASK, max_tokens=MAX_TOKENS, seed=seed, extra_body=extra, **sampling
            )
            c = r.choices[0]
            return SeenReply(
                c.message.content, c.finish_reason == "stop", r.model_extra["mlx_spec"], r.usage.prompt_tokens
            )
        if case.api == "completions":
            r = self.openai.completions.create(
                model="tiny", prompt=ids, max_tokens=MAX_TOKENS, seed=seed, extra_body=extra, **sampling
            )
            c = r.choices[0]
            return SeenReply(c.text, c.finish_reason == "stop", r.model_extra["mlx_spec"], r.usage.prompt_tokens)
        if case.api == "responses":
            if seed is not None:
                extra["seed"] = seed
            r = self.openai.responses.create(
                model="tiny", input=ASK, max_output_tokens=MAX_TOKENS, store=False, extra_body=extra, **sampling
            )
            return SeenReply(r.output_text, r.status == "completed", r.model_extra["mlx_spec"], r.usage.input_tokens)
        assert case.api == "messages" and not case.seeded  # Anthropic's API takes no seed
        extra.update(temperature=case.temperature)  # anthropic 2.x's create() takes no sampling arguments
        if case.top_p is not None:
            extra["top_p"] = case.top_p
        m = self.anthropic.messages.create(model="tiny", messages=ASK, max_tokens=MAX_TOKENS, extra_body=extra)
        text = "".join(b.text for b in m.content if b.type == "text")
        prompt = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
        return SeenReply(text, m.stop_reason == "end_turn", m.model_extra["mlx_spec"], prompt)


def exact_law(target, tokenizer, ids: list[int], probs_fn) -> dict[tuple[str, bool], float]:
    """P(text, ended) of a two-token reply to `ids`, from the target's own distributions: the tokens decoded as the
    server decodes them (its streaming detokenizer, EOS ending the reply unshown)."""
    logits = target(mx.array([ids + [a] for a in range(vocab_width(target))]))  # (V, L + 1, V)
    first, second = probs_fn(logits[0, -2]).tolist(), probs_fn(logits[:, -1]).tolist()
    eos, detok, law = tokenizer.eos_token_ids, tokenizer.detokenizer, {}
    for a, pa in enumerate(first):
        if pa == 0:
            continue
        if a in eos:
            law[("", True)] = law.get(("", True), 0.0) + pa
            continue
        for b, pb in enumerate(second[a]):
            if pb == 0:
                continue
            detok.reset()
            detok.add_token(a)
            if b not in eos:
                detok.add_token(b)
            detok.finalize()
            key = (detok.text, b in eos)
            law[key] = law.get(key, 0.0) + pa * pb
    return law


def bait(target, ids: list[int], probs_fn) -> list[int]:
    """`ids`, a token x, then `ids` again: a context drafter drafts x next; x is the token whose odds there are
    nearest even, so its drafts are accepted about half the time."""
    width = vocab_width(target)
    q = probs_fn(target(mx.array([ids + [x] + ids for x in range(width)]))[:, -1])  # (V, V): the law after each x
    odds = q[mx.arange(width), mx.arange(width)].tolist()  # x's own probability after ids, x, ids
    x = min(range(width), key=lambda x: abs(odds[x] - 0.5))
    return ids + [x] + ids


def judge(replies: list[SeenReply], law: dict) -> tuple[bool, float, float]:
    """(not rejected, chi-square, critical value) of the replies against the law; a reply outside its support
    rejects it outright."""
    counts: dict[tuple[str, bool], int] = {}
    for r in replies:
        counts[(r.text, r.ended)] = counts.get((r.text, r.ended), 0) + 1
    if not set(counts) <= set(law):
        return False, float("inf"), 0.0
    return chi_square_pvalue_ok(counts, law, len(replies))


@pytest.fixture(scope="module")
def first_blocks(tiny_models, tmp_path_factory) -> Path:
    """A draft model of the tiny target's first two blocks (its embeddings and final norm too): a law that overlaps
    the target's, so drafts are accepted and rejected alike."""
    folder = tmp_path_factory.mktemp("draft") / "qwen2_first_blocks"
    shutil.copytree(tiny_models["qwen2"], folder)
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = BLOCKS
    (folder / "config.json").write_text(json.dumps(config))
    weights = mx.load(str(folder / "model.safetensors"))
    kept = {k: w for k, w in weights.items() if not k.startswith("model.layers.") or int(k.split(".")[2]) < BLOCKS}
    mx.save_safetensors(str(folder / "model.safetensors"), kept)
    return folder


@dataclass
class Served:
    """A running server, the gate before its target's passes, its clients, and the pair it loaded (ungated)."""

    srv: Running
    gate: Slow
    clients: Clients
    pair: Pair

    def replies(self, case: Case, together: bool, n: int, ids: list[int]) -> list[SeenReply]:
        """n replies of `case`: one request at a time, or in waves of WAVE requests let in at once (`together`)."""
        mx.random.seed(0)  # the server's unseeded draws come from this process's key: the same start each time
        if not together:
            replies = [self.clients.ask(case, i, ids) for i in range(n)]
            assert all(r.stats["widest"] == 1 for r in replies)  # each ran alone
            return replies
        replies = []
        with ThreadPoolExecutor(WAVE) as pool:
            for start in range(0, n, WAVE):
                self.gate.hold()
                try:
                    wave = [pool.submit(self.clients.ask, case, i, ids) for i in range(start, start + WAVE)]
                    wait_for(self.srv, lambda h: h["active"] + h["queued"] == WAVE)
                finally:
                    self.gate.release()
                replies += [f.result() for f in wave]
        widest = [r.stats["widest"] for r in replies]
        assert sum(w > 1 for w in widest) >= n * 3 // 4, widest  # most verified beside others in one pass
        return replies

    def judged(self, case: Case, together: bool, n: int = N) -> tuple[bool, float, float]:
        """(not rejected, chi-square, critical value) of n replies of `case` against the target's exact law, once
        they are known to have drafted and to answer the prompt the law is of."""
        ids = self.clients.ids
        if case.draft == "suffix":
            assert case.api == "completions"  # the one API that takes a prompt's token ids as they are
            ids = bait(self.pair.target, ids, case.probs_fn())
        replies = self.replies(case, together, n, ids)
        assert all(r.prompt_tokens == len(ids) for r in replies)
        assert all(r.stats["drafted"] >= 1 for r in replies)  # the first round drafted
        return judge(replies, exact_law(self.pair.target, self.pair.tokenizer, ids, case.probs_fn()))


@pytest.fixture(scope="module")
def served(tiny_models, first_blocks):
    """A server of the tiny target drafted by `first_blocks` in every round, its target behind a gate."""
    loaded = Pair.load(str(tiny_models["qwen2"]), str(first_blocks), num_draft=2)
    pair, gate = gated(loaded)
    pair.adaptive = False  # every round drafts
    with Running(build_app(pair, max_concurrency=WAVE, max_tokens=MAX_TOKENS)) as srv:
        yield Served(srv, gate, Clients(srv, pair.chat_ids(ASK)), loaded)


@pytest.fixture
def always_batch(monkeypatch):
    """Requests join the batch whatever round costs this machine measures (the batched cases are about batching)."""
    monkeypatch.setattr(Costs, "pays", lambda self, rows: True)


CASES = [  # every API, with top-k or top-p or both in three of them
    Case("chat", 1.0),
    Case("completions", 0.8, top_k=12),
    Case("responses", 1.0, top_p=0.9),
    Case("messages", 0.7, top_k=20, top_p=0.95),
]
SUFFIX = Case("completions", 1.0, draft="suffix")  # a deterministic draft: p one-hot
SEEDED = [Case(api, 1.0, seeded=True) for api in ("chat", "completions", "responses")]  # Gumbel-max: drafts must match


# Alone: a sampled draft with both filters and the suffix's one-hot draft (every API's options: the concurrent cases)
@pytest.mark.parametrize("case", [CASES[3], SUFFIX], ids=str)
def test_replies_one_at_a_time_keep_the_target_law(served, case):
    ok, stat, crit = served.judged(case, together=False)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


@pytest.mark.parametrize("case", [*CASES, SUFFIX, *SEEDED], ids=str)
def test_concurrent_replies_sharing_rounds_keep_the_target_law(served, always_batch, case):
    ok, stat, crit = served.judged(case, together=True)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


@pytest.mark.parametrize(  # each rule once, the model's draft and the suffix's both met
    "broken, case, n",
    [  # replies enough to reject with a margin: chi-square over its critical value about 3x, 24x and 4x here
        ("resample_from_target", CASES[1], 2 * N),
        ("always_accept", SUFFIX, N // 2),
        ("seeded_always_accept", SEEDED[0], N // 2),
    ],
    ids=str,
)
def test_a_broken_verify_rule_in_the_server_fails_the_same_test(served, always_batch, monkeypatch, broken, case, n):
    """The server's verify rule broken in its process: the same replies, counted the same way, are rejected."""
    if broken == "resample_from_target":  # a rejected draft resampled from q: forgets to subtract the draft
        monkeypatch.setattr(verify, "_residual", lambda q, p: q)
    elif broken == "always_accept":  # p(x) tiny, so q/p huge: every draft accepted
        real = verify.sampling_targets
        monkeypatch.setattr(verify, "sampling_targets", lambda q, d, p: real(q, d, mx.full(q[: d.size].shape, 1e-9)))
    else:  # seeded (Gumbel-max): every draft taken for the row's own token
        monkeypatch.setattr(verify, "accept_greedy", lambda draft, targets: (len(draft), targets[len(draft)]))
    ok, stat, crit = served.judged(case, together=True, n=n)
    assert not ok, f"broken rule {broken} passed: chi2 {stat:.1f} < {crit:.1f}"
