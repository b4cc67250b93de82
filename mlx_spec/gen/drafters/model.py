"""A separate small model drafts with its own KV cache, for every row of an engine in one pass a position."""

from collections.abc import Iterable, Sequence
from typing import Generic, Self, TypeVar, cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import can_trim_prompt_cache

from ...device import builds_per_shape
from ...errors import GenerationError
from ...models.base import text_of
from ...models.head import SubsetHead
from .. import recurrent, shapes
from ..cache import copy_prefix, new_cache
from ..joint import JointCache
from ..sampling import sample
from ..tunables import HINDSIGHT_MAX, HINDSIGHT_MIN, PREFILL_STEP
from ..tunables import NGRAM_SYNC_TAIL as SYNC_TAIL
from .base import Draft, Drafter, Drafting, Kept, Member


class ModelDrafter(Drafter):
    """Drafts from a small model whose cache holds `fed`, the prompt fed when it first drafts, not before."""

    name = "model"
    model: nn.Module
    origin = 0  # the context position of the first token it is fed

    def __init__(self, model, vocab_size: int, real_vocab: int | None = None, head_ids: Iterable[int] | None = None):
        """vocab_size: the target's logits width; ids from real_vocab on are padding; head_ids: `head.SubsetHead`'s."""
        self.view(recurrent.recording(model))
        self.head = SubsetHead(self.model, head_ids or []) if SubsetHead.supports(self.model) else None
        self.subset = head_ids is not None and self.head is not None
        self.vocab_size, self.real_vocab = vocab_size, real_vocab
        self.cache: list | None = None  # its own cache (None while an engine's drafting holds it)
        self.fed: list[int] = []
        self.agreed = 0  # first tokens of `fed` known to equal the context's (`agrees`)
        self.drafted: tuple | None = None  # the last draft (lazy tokens, how many of them the cache holds)
        self.output_from: int | None = None  # the context's first output token (the prompt's length)

    def view(self, model) -> None:
        """Draft with `model` (its text model's body gives the states a split head reads)."""
        self.model, self.body = model, text_of(model).body

    def drafting(self) -> Drafting:
        return ModelDrafting(self)

    def reset(self, prompt: list[int], target_cache: list | None = None) -> None:
        """The cache keeps what it shares with `prompt`; the rest is fed when the planner first drafts."""
        self.output_from = len(prompt)
        if self.head is not None and self.subset:
            self.head.add(prompt)

    def settle(self) -> None:
        """The last draft's tokens the cache holds join `fed` (the engine read them with its verify pass)."""
        if self.drafted is not None:
            tokens, n = self.drafted
            self.fed.extend(tokens.tolist()[:n])
            self.drafted = None

    @property
    def nbytes(self) -> int:
        """Bytes of its own cache (none where it drafts in the target's or catches up a learned head's)."""
        if self.cache is None or self.in_target_cache or self.reads:
            return 0
        return sum(c.nbytes for c in self.cache)

    def fork(self, tokens: list[int]) -> Kept | None:
        """A copy of its cache's first positions where they hold `tokens` from `origin` on (none for a learned head,
        which also needs the target's states there, nor for a view drafting in the target's cache)."""
        if self.in_target_cache or self.reads:
            return None
        m = len(tokens) - self.origin  # the draft cache holds the context from position `origin` on
        self.settle()
        if self.cache is None or self.fed[:m] != tokens[self.origin :]:
            return None
        cache = copy_prefix(self.cache, m)
        return None if cache is None else Kept(id(self.model), (cache, self.fed[:m]), sum(c.nbytes for c in cache))

    def adopt(self, kept: Kept, n: int) -> None:
        """Its cache becomes a copy of `kept`'s, up to the context's first `n` tokens, where `kept` ran its model."""
        if self.in_target_cache or self.reads or kept.key != id(self.model):
            return
        cache, fed = kept.state
        m = min(len(fed), n - self.origin)
        if m > 0:
            self.settle()
            self.cache, self.fed = copy_prefix(cache, m, own=False), fed[:m]

    def agrees(self, context: list[int]) -> int:
        """How many first tokens of `fed` equal the context's (its last aside): from the last count, checked in O(1) by
        its ends as `extends` does, walked on over the tokens since; else from 0."""
        fed = self.fed
        end = min(len(fed), len(context) - 1)
        n = min(self.agreed, end)
        tail = max(0, n - SYNC_TAIL)
        i = n if context[:1] == fed[:1] and context[tail:n] == fed[tail:n] else 0
        while i < end and fed[i] == context[i]:
            i += 1
        self.agreed = i
        return i

    def behind(self, context: list[int]) -> int:
        """Context tokens but the last its cache lacks, from the tail (`fed` is a prefix plus rejected drafts)."""
        self.settle()
        i = min(len(self.fed), len(context) - 1)
        while i > 0 and self.fed[i - 1] != context[i - 1]:
            i -= 1
        return len(context) - 1 - i

    def propose(self, context: list[int], k: int, sampler=None) -> Draft:
        drafting = self.drafting()
        try:
            return drafting.propose([Member(self, context, sampler)], k)[0]
        finally:
            drafting.leave(self)

    def forward(self, x: mx.array, cache: list, states: mx.array | None = None) -> mx.array:
        """States (B, L, d) of feeding x (B, L) with a split head, else logits (B, L, V); states: what a learned
        drafter reads beside the tokens (unused here)."""
        return self.body(x, cache=cache) if self.head is not None else self.model(x, cache=cache)

    def given(self, owners: Sequence[Self | None], starts: list[int], n: int) -> mx.array | None:
        """What each place's drafter reads beside its n tokens fed from `starts` (None: tokens alone)."""
        return None

    def tree(self, state: mx.array, k: int, nodes: int, rows: JointCache) -> tuple[mx.array, tuple[int, ...]]:
        """A tree of `nodes` draft tokens, k deep, from `state`, and each one's parent (a drafter that `trees`)."""
        raise NotImplementedError

    def full(self, h: mx.array) -> mx.array:
        """Target-width logits of states h (hidden with a split head, else logits already), padding ids masked."""
        logits = self.head.full(h) if self.head is not None else h
        v = logits.shape[-1]
        if v > self.vocab_size:
            logits = logits[..., : self.vocab_size]
        elif v < self.vocab_size:
            pad = mx.full((*logits.shape[:-1], self.vocab_size - v), -mx.inf, logits.dtype)
            logits = mx.concatenate([logits, pad], axis=-1)
        if self.real_vocab is not None and self.real_vocab < self.vocab_size:
            logits = mx.where(mx.arange(self.vocab_size) >= self.real_vocab, -mx.inf, logits)
        return logits

    def greedy(self, h: mx.array) -> mx.array:
        """The greedy draft token at each row of h (lazy): over the vocabulary subset where there is one."""
        if self.head is not None and self.subset:
            return self.head.ids()[mx.argmax(self.head.subset(h), -1)]
        return mx.argmax(self.full(h), -1)


D = TypeVar("D", bound=ModelDrafter)


class ModelDrafting(Drafting, Generic[D]):
    """The rows drafting with one draft model over their caches as one (`JointCache`): catch-up, then k - 1 passes."""

    def __init__(self, part: D):
        self.model, self.part = part.model, part
        self.rows: JointCache[D] = JointCache()  # owners: the members' drafters

    def takes(self, part) -> bool:
        return getattr(part, "model", None) is self.model and not part.in_target_cache

    def leave(self, part) -> None:
        if any(o is part for o in self.rows.owners):
            part.settle()
            part.cache = self.rows.remove(part, len(part.fed))

    def _join(self, part: D) -> None:
        if not any(o is part for o in self.rows.owners):
            part.settle()
            cache, part.cache = part.cache if part.cache is not None else new_cache(self.model), None
            if not can_trim_prompt_cache(cache):
                raise GenerationError(f"{part.name} drafter: its KV cache cannot be trimmed, so drafts cannot rewind")
            self.rows.add(part, cache)

    def propose(
        self, members: Sequence[Member], k: int, target=None, chunk: int | None = None, tree: int = 0
    ) -> list[Draft]:
        if k <= 0:
            return [Draft.of([], source=self.part.name) for _ in members]
        try:
            return self._draft(members, k, chunk, tree)
        except BaseException:  # interrupted mid-pass: every drafter gets its cache back as far as it can be rewound
            for o in [o for o in self.rows.owners if o is not None]:
                o.drafted = None
                try:
                    self.leave(o)
                except ValueError:
                    self.rows.owners[self.rows.index(o)] = None
                    o.cache, o.fed = None, []
            raise

    def _gather(self, members: Sequence[Member]) -> tuple[list, list[Member | None]]:
        """The members' drafters joined, every place settled, packed where rows that left hold half: (the places'
        drafters, None where a row left; each place's member, None where not asked)."""
        for member in members:
            self._join(cast(D, member.part))  # `takes` let in this model's drafters only
        for o in self.rows.owners:
            if o is not None:
                o.settle()
        if sum(o is None for o in self.rows.owners) * 2 > len(self.rows.owners):
            self.rows.pack([len(o.fed) for o in self.rows.owners if o is not None])
        asked = {id(m.part): m for m in members}
        return self.rows.owners, [asked.get(id(o)) if o is not None else None for o in self.rows.owners]

    def _draft(self, members: Sequence[Member], k: int, chunk: int | None, tree: int = 0) -> list[Draft]:
        part, (places, mine) = self.part, self._gather(members)
        feeds, drop, ready, judge = zip(*[_catch_up(o, m, chunk) for o, m in zip(places, mine)])
        if any(drop):
            try:
                self.rows.rewind(drop)
            except ValueError:  # a cache that cannot go back that far (a sliding window): every row starts over
                for o in [o for o in places if o is not None]:
                    o.cache, o.fed, o.drafted = None, [], None
                self.rows = JointCache()
                return self._draft(members, k, chunk, tree)
        self.rows.start_round()
        outs, state, cold = self._feed(feeds, [j + 1 if r else 0 for j, r in zip(judge, ready)])
        seen = {i: (part.greedy(h[:-1]), feeds[i][-j:]) for i, (h, j) in enumerate(zip(outs, judge)) if j}
        if part.head is not None and part.subset:  # judged on the subset as it was: the output must not credit itself
            for f in feeds:
                part.head.add(f)
        drafting = [m if r else None for m, r in zip(mine, ready)]
        lone = places[0] if len(places) == 1 else None
        if tree and part.trees and lone is not None and drafting[0] is not None:  # a row alone: a tree, its entries
            lone.fed.extend(feeds[0])  # dropped from the cache after (the kept path is fed back with its states)
            tokens, parents = part.tree(state, k, tree, self.rows)
            return [Draft(tokens, None, part.name, len(feeds[0]) - 1, seen.get(0), cold, parents)]
        tokens, probs = draft_steps(part, state, drafting, k, self.rows.layers)
        if k > 1 and not all(drafting):  # places that drafted for nobody keep none of it
            self.rows.rewind([0 if m is not None else k - 1 for m in drafting])
        out = {}
        for i, (o, m, f, r) in enumerate(zip(places, mine, feeds, ready)):
            if m is None or o is None:
                continue
            o.fed.extend(f)
            drafted = o.drafted = (tokens[i], k - 1) if r else None  # its own array: read once, with the verify pass
            none = Draft.of([], source=part.name, behind=len(f))
            out[id(o)] = Draft(drafted[0], probs[i], part.name, len(f) - 1, seen.get(i), cold) if drafted else none
        mx.async_eval([d.tokens for d in out.values() if len(d)])  # the device drafts while the host goes on
        return [out[id(m.part)] for m in members]

    def _feed(self, feeds: Sequence[list[int]], need: Sequence[int]):
        """Feed each place its tokens: (per place its last need[i] states, each place's last state, whether new)."""
        width = max(1, max(len(f) for f in feeds))
        tail = width if len(feeds) > 1 else (min(width, PREFILL_STEP) if self.part.head is not None else max(need))
        cold = False
        for start in range(0, width - tail, PREFILL_STEP):
            cold = self._pass([f[start : min(start + PREFILL_STEP, width - tail)] for f in feeds], start)[1] or cold
        last = [f[width - tail :] for f in feeds]
        h, first = self._pass(last, width - tail)
        at = [max(1, len(f)) for f in last]  # each place's last fed column (a place fed nothing: a dummy's)
        state = mx.stack([h[i, a - 1] for i, a in enumerate(at)])
        return [h[i, a - n : a] if n else None for i, (a, n) in enumerate(zip(at, need))], state, cold or first

    def _pass(self, feeds: list[list[int]], skip: int):
        """One pass over every place, right-padded, the padding dropped: (its states (P, L, d or V), whether new);
        skip: tokens of each place's catch-up fed before."""
        n = max(1, max(len(f) for f in feeds))
        size = shapes.padded(n) if builds_per_shape() and self.rows.paddable() else n
        x = mx.array([f + [f[-1] if f else 0] * (size - len(f)) for f in feeds], dtype=mx.uint32)  # (P, size)
        owners = self.rows.owners
        starts = [len(o.fed) + skip if o is not None else 0 for o in owners]
        h = self.part.forward(x, self.rows.layers, self.part.given(owners, starts, size))
        self.rows.rewind([size - len(f) for f in feeds])
        return h, shapes.first_time(self.model, (len(feeds), size))


def _catch_up(o: ModelDrafter | None, m: Member | None, chunk: int | None):
    """A place's (tokens to feed, positions to drop, whether it drafts, output tokens to judge in hindsight): the rest
    of its context, a chunk a round where others wait; a greedy catch-up over HINDSIGHT_MIN outputs is judged."""
    if m is None or o is None:
        return [], 0, False, 0
    keep = o.agrees(m.context)
    todo, drop = m.context[keep:], len(o.fed) - keep
    del o.fed[keep:]
    o.agreed = keep + min(len(todo), chunk or len(todo))  # `fed` takes what is fed now
    if chunk is not None and len(todo) > chunk:
        return todo[:chunk], drop, False, 0
    n = min(len(todo) - 1, len(m.context) - o.output_from, HINDSIGHT_MAX) if o.output_from is not None else 0
    greedy = m.sampler is None or m.sampler.temp == 0
    return todo, drop, True, n if greedy and n >= HINDSIGHT_MIN else 0


def draw(members: Sequence[Member | None], greedy: mx.array, h: mx.array, full, at: int = 0):
    """(tokens (P, L), each place's distributions (L, V) or None): each place's `greedy` tokens (P, L), or its member's
    draws from the logits full(h[i]) (L, V) by its rule, the first at context position len(context) + at."""
    probs: list[mx.array | None] = [None] * len(members)
    if not any(m is not None and m.sampler is not None and m.sampler.temp for m in members):
        return greedy, probs
    rows = []
    for i, m in enumerate(members):
        s = m.sampler if m is not None else None
        if m is None or s is None or not s.temp:
            rows.append(greedy[i])
        elif s.seed is not None:
            rows.append(s.pick(full(h[i]), len(m.context) + at))
        else:
            q = probs[i] = s.probs(full(h[i]))
            rows.append(sample(q))
    return mx.stack(rows).astype(mx.uint32), probs


def draft_steps(part: ModelDrafter, state: mx.array, members: list[Member | None], k: int, cache: list):
    """(tokens (P, k), each place's distributions (k, V) or None): k drafts from each place's state (P, d or V) by its
    member's rule (none: greedy), each but the last fed back through `cache`."""
    tokens, dists = [], []
    for j in range(k):
        step, probs = draw(members, part.greedy(state)[:, None], state[:, None], part.full, part.origin + j)
        tokens.append(step)
        dists.append(probs)
        if j + 1 < k:
            state = part.forward(step, cache, state[:, None])[:, -1]
    per = [mx.concatenate([d[i] for d in dists]) if dists[0][i] is not None else None for i in range(len(members))]
    return mx.concatenate(tokens, axis=1), per
