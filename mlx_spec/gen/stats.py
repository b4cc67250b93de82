"""What a generation measured: tokens, rounds, acceptance by position, reads of the device, the planner's costs."""

from dataclasses import dataclass, field


@dataclass
class Stats:
    """What a generation measured; algorithms fill it, only faces print it."""

    prompt_tokens: int = 0  # the whole prompt (conversation so far)
    prompt_cached: int = 0  # of which were already in the caller's cache (not prefilled again)
    prompt_time: float = 0.0
    generation_tokens: int = 0
    first_tokens: int = 0  # tokens the first round delivered: made within prompt_time, as mlx-lm counts the first
    generation_time: float = 0.0  # from the first round's tokens to the last round's
    from_draft: int = 0  # generated tokens that were accepted drafts (a last round may accept some past the end)
    rounds: int = 0  # target passes after the prompt
    spec_rounds: int = 0  # rounds that verified at least one draft token
    proposed: int = 0
    accepted: int = 0
    proposed_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    syncs: int = 0  # times the host waited to read the device: one per round
    wait_time: float = 0.0  # seconds the host spent waiting on those reads (the rest of a round is the host's)
    peak_memory_gb: float = 0.0  # highest MLX allocation during the run above what was in use at its start
    widest: int = 0  # the most rows a round of this generation verified in one pass (1: it ran alone)
    drafted_together: int = 0  # the most rows a draft model or view of the target drafted for in one of its passes
    fallback: str | None = None  # why speculation stopped early, if it did
    left_out: str | None = None  # a drafter's source the target cannot run, and why (the drafter's `left_out`)
    finish_reason: str | None = None
    costs: dict = field(default_factory=dict)  # the planner's measured seconds per round by verify size at the end
    trace: list[dict] | None = None  # a list to fill: one entry per round, what was planned and what it cost

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens this generation processed (the rest came from the cache)."""
        return self.prompt_tokens - self.prompt_cached

    @property
    def prompt_tps(self) -> float:
        return self.prefill_tokens / self.prompt_time if self.prompt_time else 0.0

    @property
    def generation_tps(self) -> float:
        """Tokens per second after the first round (whose tokens belong to the prompt phase, as mlx-lm's first token
        does); 0 for a reply of one round, which has no time of its own."""
        n = self.generation_tokens - self.first_tokens
        return n / self.generation_time if self.generation_time > 0 and n > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted(self) -> float:
        """Draft tokens accepted per speculative round."""
        return self.accepted / self.spec_rounds if self.spec_rounds else 0.0

    @property
    def draft_share(self) -> float:
        """Share of generated tokens that came from drafts (each token's own flag is `from_draft`)."""
        return self.from_draft / self.generation_tokens if self.generation_tokens else 0.0

    def acceptance_by_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_by_position, self.proposed_by_position)]

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "trace" or v is not None}
        d.update({k: getattr(self, k) for k, v in vars(Stats).items() if isinstance(v, property)})
        return dict(d, acceptance_by_position=self.acceptance_by_position())

    def record(self, n: int, a: int) -> None:
        """A round that verified n draft tokens and accepted a."""
        self.rounds += 1
        if n == 0:
            return
        self.spec_rounds += 1
        self.proposed, self.accepted = self.proposed + n, self.accepted + a
        grow = max(0, n - len(self.proposed_by_position))
        self.proposed_by_position += [0] * grow
        self.accepted_by_position += [0] * grow
        for i in range(n):
            self.proposed_by_position[i] += 1
            self.accepted_by_position[i] += i < a
