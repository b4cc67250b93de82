"""The server's batched rounds: requests that start while others generate join one `gen.batch.Batch`, whose every
round verifies all of them in one target forward pass; each keeps its own session, sampling rule and stats.

A request joins when it has no seed (a seeded request reseeds per turn, which one shared round cannot do) and its
session's target cache is a plain KV cache; it stays in the batch to its end, and leaves with its cache back in its
session, so the conversation's next turn reuses it. A request that starts alone runs the single-stream engine (with
its draft model and planner): at one client the server is the engine.
"""

from dataclasses import dataclass
from typing import Dict, List, Tuple

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


class Batcher:
    """The batch and which request each of its rows serves."""

    def __init__(self, pair):
        self.pair = pair
        self.batch = Batch(pair.target, adaptive=pair.adaptive)
        self.members: Dict[object, Member] = {}  # job -> member

    def __len__(self) -> int:
        return len(self.members)

    def can_join(self, job) -> bool:
        return job.params.seed is None and batchable(job.session.drafter, job.session.cache)

    def join(self, job) -> None:
        """Prefill the request's prompt on its session (reusing the cached prefix), then add it as a row."""
        p, ids, session = job.params, list(job.ids), job.session
        probs_fn = make_probs_fn(p.temp, p.top_p, p.top_k)  # a bad option fails here, before the batch sees it
        cached = session.prefill(ids)
        stats = Stats()
        stats.prompt_tokens, stats.prompt_cached = len(ids), cached
        budget, at_limit, limit = p.max_tokens, "length", context_limit(self.pair.target)
        if limit is not None and limit - len(ids) < budget:
            budget, at_limit = limit - len(ids), "context"
        row = Row(ids, session.drafter, probs_fn, budget, at_limit, frozenset(self.pair.tokenizer.eos_token_ids),
                  session.planner.k_max, stats=stats)
        self.batch.add(row, session.cache)
        self.members[job] = Member(row, self.pair.tokenizer.detokenizer)

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
            detok = self.members[job].detok
            for s in steps:
                if s.token not in row.eos:
                    detok.add_token(s.token)
                if s.finish_reason:
                    detok.finalize()
                out.append((job, Event(s.token, detok.last_segment, s.from_draft, row.stats, s.finish_reason)))
        return out

    def clear(self) -> List[object]:
        """Forget every row (after a failed round): the jobs that were in it."""
        jobs = list(self.members)
        self.members.clear()
        self.batch = Batch(self.pair.target, adaptive=self.pair.adaptive)
        return jobs
