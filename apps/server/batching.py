"""The server's batched rounds: requests that start while others generate join one `gen.batch.Batch`, whose every
round verifies all of them in one target forward pass; each keeps its own session, sampling rule and stats.

A request joins when it has no seed (a seeded request reseeds per turn, which one shared round cannot do), its
session's target cache is a plain KV cache, and the batch's measured round costs say a batched round is cheaper than
as many single ones (`BatchPlanner.pays`: on a device where a pass costs its positions, as this project's CPU,
requests keep their own turns and their draft models); it stays in the batch to its end, and leaves with its cache back in its
session, so the conversation's next turn reuses it. A request that starts alone runs the single-stream engine (with
its draft model and planner): at one client the server is the engine; when a second one comes, the first moves into
the batch between two of its tokens (its engine closed, its cache exact, its text and counters carried over).
"""

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from mlx_spec.gen.batch import Batch, Row, batchable
from mlx_spec.gen.engine import context_limit
from mlx_spec.gen.sampling import make_probs_fn
from mlx_spec.gen.stats import Stats
from mlx_spec.gen.stream import Event


@dataclass
class Member:
    """A request in the batch: its row and its own streaming detokenizer."""

    row: Row
    detok: object
    pending: str = ""  # text owed from before it joined, sent with its next token


class Batcher:
    """The batch and which request each of its rows serves."""

    def __init__(self, pair):
        self.pair = pair
        self.batch = Batch(pair.target, adaptive=pair.adaptive)
        self.members: Dict[object, Member] = {}  # job -> member

    def __len__(self) -> int:
        return len(self.members)

    def can_join(self, job, rows: int) -> bool:
        """A request without a seed, on a plain KV cache, where the measured round costs say a batch of `rows`
        rows pays."""
        return (job.params.seed is None and batchable(job.session.cache)
                and self.batch.planner.pays(max(2, rows)))

    def join(self, job, produced: Optional[List[int]] = None, stats: Optional[Stats] = None, sent: str = "") -> None:
        """Prefill the request's prompt on its session (reusing the cached prefix), then add it as a row.

        A request that was generating alone (its engine generator closed, so its session's cache holds the
        context minus the last token) joins with what it `produced`, its `stats` and the text it `sent`."""
        p, session = job.params, job.session
        probs_fn = make_probs_fn(p.temp, p.top_p, p.top_k)  # a bad option fails here, before the batch sees it
        produced = list(produced or [])
        context = list(job.ids) + produced
        cached = session.prefill(context)
        if stats is None:
            stats = Stats()
            stats.prompt_tokens, stats.prompt_cached = len(job.ids), cached
        budget, at_limit, limit = p.max_tokens, "length", context_limit(self.pair.target)
        if limit is not None and limit - len(job.ids) < budget:
            budget, at_limit = limit - len(job.ids), "context"
        row = Row(context, session.drafter, probs_fn, budget, at_limit, frozenset(self.pair.tokenizer.eos_token_ids),
                  session.planner.k_max, stats=stats)
        detok = self.pair.tokenizer.detokenizer
        for t in produced:
            if t not in row.eos:
                detok.add_token(t)
        pending = detok.last_segment[len(sent):]  # text held back mid-character when it left the engine
        if produced:
            row.first_at = row.started - stats.generation_time
        self.batch.add(row, session.cache)
        self.members[job] = Member(row, detok, pending)

    def leave(self, job) -> None:
        """Take the request's row out; its session gets the row's cache (context minus the last token)."""
        member = self.members.pop(job)
        cache = self.batch.remove(member.row)
        job.session.restore(cache, member.row.context[:-1])

    def round(self) -> List[Tuple[object, Event]]:
        """One batched round: every member's new tokens, as the single-stream engine's events."""
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
        """Forget every row (after a failed round): the jobs that were in it."""
        jobs = list(self.members)
        self.members.clear()
        self.batch = Batch(self.pair.target, adaptive=self.pair.adaptive)
        return jobs
