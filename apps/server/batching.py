"""The server's batched rounds: requests that start while others generate join one `gen.batch.Batch`, whose every
round verifies all of them in one target forward pass (their draft model or view of the target, if their drafter has
one, drafting for all of them in one pass per position); each keeps its own session, sampling rule and stats.

A request joins when it has no seed (a seeded request reseeds per turn, which one shared round cannot do), its
session's target cache can batch (`batch_cache.batchable`), and the batch's measured round costs say a batched round
is cheaper than as many single ones (`BatchPlanner.pays`: where a pass costs its positions, requests keep their own
turns). Its prompt goes in a chunk per round, beside the running rows; it stays in the batch to its end and leaves
with its caches back in its session, so the conversation's next turn reuses them. A request that starts alone runs
the single-stream engine: at one client the server is the engine; when a second one comes, the first moves into the
batch between two of its tokens (its engine closed, its caches exact, its text and counters carried over).
"""

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

from mlx_spec.gen.batch import Batch, Row
from mlx_spec.gen.batch_cache import batchable
from mlx_spec.gen.engine import context_limit
from mlx_spec.gen.sampling import make_probs_fn
from mlx_spec.gen.stats import Stats
from mlx_spec.gen.stream import Event
from mlx_spec.gen.tunables import PREFILL_STEP


@dataclass
class Member:
    """A request in the batch: its row and its own streaming detokenizer."""

    row: Row
    detok: object
    pending: str = ""  # text owed from before it joined, sent with its next token


@dataclass
class Joining:
    """A request on its way into the batch: its prefill, and what it brings from the engine if it was generating."""

    prefill: Iterator[Tuple[bool, int]]
    context: List[int]
    produced: List[int]
    stats: Optional[Stats]
    sent: str
    probs_fn: object


class Batcher:
    """The batch and which request each of its rows serves."""

    def __init__(self, pair, chunk: int = PREFILL_STEP):
        self.pair, self.chunk = pair, chunk
        self.batch = Batch(pair.target, adaptive=pair.adaptive)
        self.members: Dict[object, Member] = {}  # job -> member
        self.joining: Dict[object, Joining] = {}  # job -> its prefill under way, in arrival order

    def __len__(self) -> int:
        return len(self.members) + len(self.joining)

    def __contains__(self, job) -> bool:
        return job in self.members or job in self.joining

    def can_join(self, job, rows: int) -> bool:
        """A request without a seed, on a cache that can batch (plain KV or rewindable recurrent layers), where the
        measured round costs say a batch of `rows` rows pays."""
        return (job.params.seed is None and batchable(job.session.cache)
                and self.batch.planner.pays(max(2, rows)))

    def join(self, job, produced: Optional[List[int]] = None, stats: Optional[Stats] = None, sent: str = "") -> None:
        """Queue the request to join: its prompt is prefilled on its session (reusing the cached prefix) a chunk
        per round (`step_joins`), beside the running rows, then it becomes a row.

        A request that was generating alone (its engine generator closed, so its session's cache holds the
        context minus the last token) joins with what it `produced`, its `stats` and the text it `sent`."""
        p = job.params
        probs_fn = make_probs_fn(p.temp, p.top_p, p.top_k)  # a bad option fails here, before the batch sees it
        context = list(job.ids) + list(produced or [])
        self.joining[job] = Joining(job.session.prefill(context, self.chunk), context, list(produced or []), stats,
                                    sent, probs_fn)

    def step_joins(self) -> None:
        """One prefill chunk of the first request waiting to join; a request whose prompt is in becomes a row."""
        for job, j in list(self.joining.items()):
            done, cached = next(j.prefill)
            if done:
                del self.joining[job]
                self._add(job, j, cached)
                continue  # nothing was prefilled (a request moved in from the engine): the next one may go too
            return

    def _add(self, job, j: "Joining", cached: int) -> None:
        p, session, stats = job.params, job.session, j.stats
        if stats is None:
            stats = Stats()
            stats.prompt_tokens, stats.prompt_cached = len(job.ids), cached
        budget, at_limit, limit = p.max_tokens, "length", context_limit(self.pair.target)
        if limit is not None and limit - len(job.ids) < budget:
            budget, at_limit = limit - len(job.ids), "context"
        row = Row(j.context, session.drafter, j.probs_fn, budget, at_limit,
                  frozenset(self.pair.tokenizer.eos_token_ids), session.planner.k_max, stats=stats)
        detok = self.pair.tokenizer.detokenizer
        for t in j.produced:
            if t not in row.eos:
                detok.add_token(t)
        pending = detok.last_segment[len(j.sent):]  # text held back mid-character when it left the engine
        if j.produced:
            row.first_at = row.started - stats.generation_time
        self.batch.add(row, session.cache)
        self.members[job] = Member(row, detok, pending)

    def leave(self, job) -> None:
        """Take the request's row out; its session gets the row's cache (context minus the last token). One still
        joining stops its prefill (its session forgets the conversation)."""
        if job in self.joining:
            self.joining.pop(job).prefill.close()
            return
        member = self.members.pop(job)
        cache = self.batch.remove(member.row)
        job.session.restore(cache, member.row.context[:-1])

    def round(self) -> List[Tuple[object, Event]]:
        """A prefill chunk of a joining request, then one batched round: every member's new tokens, as the
        single-stream engine's events."""
        self.step_joins()
        if not self.batch.rows:
            return []
        jobs = {id(m.row): job for job, m in self.members.items()}
        out = []
        for i, steps in self.batch.round().items():
            row = self.batch.rows[i]
            job = jobs[id(row)]
            member = self.members[job]
            for s in steps:
                if s.token not in row.eos:
                    member.detok.add_token(s.token)
                if s.finish_reason:
                    member.detok.finalize()
                text, member.pending = member.pending + member.detok.last_segment, ""
                out.append((job, Event(s.token, text, s.from_draft, row.stats, s.finish_reason)))
        return out

    def clear(self) -> List[object]:
        """Forget every row (after a failed round): the jobs that were in it or joining it."""
        jobs = list(self.members) + list(self.joining)
        for j in self.joining.values():
            j.prefill.close()
        self.members.clear()
        self.joining.clear()
        self.batch = Batch(self.pair.target, adaptive=self.pair.adaptive)
        return jobs
