"""Which source drafts next and how many tokens: a cost model fed by measured acceptance and timings.

Expected tokens from a round with k drafts and per-token acceptance a (the geometric model of
Leviathan et al.): E(k) = (1 - a^(k+1)) / (1 - a), here with the first draft token accepted with its own
probability p: E(k) = 1 + p (1 - a^k) / (1 - a) (p = a is the geometric model; see below). Its cost is
verify(k) + k * draft_per_token, both measured online. Each round the policy takes, over every source
the drafter offers and every k up to what that source can draft, the pair with the highest
E(k) / cost(k); k = 0 is plain decoding, so speculation switches itself off wherever it would make the
user slower. A source passed over (for plain decoding or for another source) gets a one-token probe
round now and then, so a stale estimate is corrected and drafting switches back on when it pays. Probes are paid from a
budget: while a source is passed over it earns PROBE_BUDGET of each round's time, and it probes once
its credit covers what a probe is expected to lose against the round chosen instead, so probes aim to cost
about 2 % of the time wherever drafting does not pay, however costly the source: on this CPU a
one-token probe of the 0.5B draft model costs about 1.1 s (verifying 2 tokens costs 1.2-1.45x
verifying 1, plus the draft's catch-up and step) against 0.55-0.65 s per plain step, and probing
every 8 steps cost 5-7 % on open prose questions. A cheap source with good odds probes more often, a
costly one with poor odds rarely, and an accepted probe raises the odds, so the next probe comes
sooner. While plain decoding is chosen, a probe whose every token is accepted is followed at once by
another of twice its length (`SourceStats.follow`) where that could pay at the better of the source's recent
and long-run odds (`follow_pays`), so a source that has become good is back on within a few rounds instead of
ramping up one token per probe interval; the probe's expected loss uses the
lower of the recent and the long-run first-token acceptance, so a source that keeps failing its probes is
not re-probed on the hope of its prior (`probe_loss`). A free source (the n-gram) is judged every round
by the engine's shadow drafts (`Policy.observe`) and needs no probes. Acceptance and draft cost are kept
per source (a hybrid's free n-gram drafts and its costly model drafts differ); the verify cost belongs to the target.
A source that has not drafted yet gets a short probe round first, so an expensive drafter shows its
cost before it is trusted with a long draft. One that must catch up first (a draft model not yet fed the
prompt: 2.1-2.3 s for a 210-245-token code edit here) waits for a round in which nothing else would draft, so
a hybrid whose suffix source is copying does not pay for a draft model it may not need (HumanEval/1:rename
spent 2.25 s of a 24 s reply on feeding the 0.5B its prompt, for one accepted token).

The plain step is the baseline every draft is judged against, and it is only measured when a round does
not draft. So while drafting is chosen only by a small margin (within RECHECK of plain), a plain step is
taken again every RECHECK_EVERY rounds, and the first few timings of each verify size are averaged, not
smoothed from the first one: a baseline timed once, high, would keep a losing drafter on for the whole
reply (the self drafter drafted 80 of 81 rounds of one code edit, at 0.81x of plain, with the plain step
timed once, at the start). A re-measure costs at most RECHECK of one round's tokens, so about 1 % of the
time; a drafter well ahead of plain is never interrupted.

A probe of a draft model that sat out is worth more than its one drafted token: the catch-up pass that feeds
the output it missed also scores it (`Draft.hindsight`, greedy decoding), so the policy learns what drafting
would have done over every one of those tokens (`Policy.hindsight`), and a model switched off by a few early
rejections (the 0.5B on code edits whose first lines are rewritten, then copied at 87-94 % acceptance by
mlx-lm's fixed-K drafting) can be back on after one probe, and one that stays poor is judged on many tokens,
not on one lucky probe.

A draft model's catch-up (the tokens it must feed before drafting: the whole prompt before its first
round, which it is fed only then, and after that what was produced since it last drafted) is costed per
token behind (`Drafter.lag`), and when choosing a source or pricing a probe it is spread over the output it
will serve (`amortized`, CATCH_UP_HORIZON tokens): it is paid once, not by one round. A source that could not repay its
catch-up even with every draft accepted over the rest of the reply (`pays_back`), such as a draft whose own
step costs about a target step, is neither probed nor fed; its costs come from a short timed pass the
drafter makes when it starts (`Drafter.step_cost`, `Policy.seed`).

Acceptance is estimated per drafted token from discounted counts (accepted / judged tokens, older
rounds weighing less): a round of 7 accepted drafts says more than a round rejected at its first
token, which a per-round average would weigh the same and so under-estimate good sources. A source
that is offered but not chosen drifts back toward its long-run acceptance, so one bad round cannot
starve it for the rest of a generation. Drafting must promise MARGIN more tokens per second than a
plain step, because estimates are noisy and a marginal draft loses as often as it wins, and it must do so
at the lower of the recent and the long-run acceptance: drafting resumes exactly when the recent estimate
has had a lucky streak, so judged on it alone a source that pays only in streaks drafts at a loss (the 0.5B
on an open prose question drafted 33 of 100 rounds, 28 of 41 tokens accepted, and those rounds cost 1.7 s
more than plain steps would have).

Drafts fail together: where a context drafter's source stops matching (an n-gram chain on a line being
rewritten) it fails at its first token round after round, which the per-token count (one judged token per
failed round) hardly notices, while the tokens after an accepted first one keep their odds. On this CPU a
verify of 7 drafts costs about 1.8 plain steps, and on one 69 s code edit the hybrid lost 4.9 s against
plain steps on 13 n-gram drafts that got no token accepted (2.9 s on five of 6-7 tokens). So the first
draft token of a round has its own estimate p (discounted counts of the rounds' first tokens, shrunk
toward the per-token a while they are few), and a source whose first tokens fail drafts short, or not at
all, until they hold again.

Between sources, a source's own drafting time must earn its keep too: its rate is discounted by
COST_MARGIN times the share of the round spent drafting. A draft model's time is a noisy online
estimate and its catch-up grows with every round it sat out, while the n-gram's near-zero cost is
known; without this the hybrid took a model draft over a short n-gram chain that the n-gram alone
turned into more tokens per second (HumanEval/2: 1.69x vs 2.22x). The discount only ranks the
sources; whether to draft at all is still judged on the undiscounted rate against plain.
"""

from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

EMA = 0.3  # weight of the newest timing: adapts within a few rounds, smooths one-off stalls
PRIOR_ACCEPT = 0.6  # acceptance assumed before any measurement: optimistic, so speculation gets tried
PRIOR_TRIALS = 2.0  # ... worth this many judged draft tokens
DISCOUNT = 0.8  # per round, the weight of older acceptance counts: the estimate follows the last ~5 rounds
IDLE_PULL = 0.1  # per round offered but not chosen: share of the way back to the long-run acceptance
MARGIN = 0.05  # drafting must promise 5 % more tokens/s than plain decoding
COST_MARGIN = 0.5  # between sources: rate / (1 + 0.5 * share of the round spent drafting)
PRIOR_VERIFY_SLOPE = 0.05  # verify(k) ~ verify(0) * (1 + 0.05 k) until measured (CPU: 633 ms -> 809 ms at k=4)
# A catch-up is spread over this many output tokens (or what is left of the reply) when a source is chosen: about
# two long drafts of a draft model, so it is paid where the source will serve a stretch of output, not one round.
CATCH_UP_HORIZON = 32
PROBE_K = 1  # draft length of a probe round (first use of a source, or a re-check): one token risks the least
PROBE_BUDGET = 0.02  # a passed-over source earns this share of each round's time towards its next probe
PROBE_MIN = 8  # ... and probes at most once per this many rounds, however cheap
FIRST_PRIOR = 1.0  # weight of the per-token estimate in the first-token one (no rounds seen: they agree)
CATCH_UP_MIN = 8  # catch-ups shorter than this ride along in the first draft pass: too short to time per token
RECHECK = 0.25  # drafting expected to beat plain by less than this re-measures plain decoding now and then
RECHECK_EVERY = 16  # ... once per this many rounds without a plain step
# Draft counts a verify pass may be padded to (16 and 32 positions): a larger matmul can cost less than a smaller
# one. OpenBLAS under MLX here: the 1.5B's pass over 16 positions took 0.79-0.80 s, over 8 0.96-0.97 s, over 12
# 1.45-1.48 s (BENCHMARKS.md §14, `notebooks/verify_cost.py`). Each size is tried once where it could pay
# (PAD_FROM drafts or more) and used where measured cheaper, so a machine whose costs rise with the size (a GPU)
# pads at most once per size.
PAD_SIZES = (15, 31)
PAD_FROM = 3


@dataclass
class SourceStats:
    """What one draft source has shown so far."""

    accepted_w: float = PRIOR_ACCEPT * PRIOR_TRIALS  # discounted accepted draft tokens
    judged_w: float = PRIOR_TRIALS  # discounted judged draft tokens (accepted + the first rejected)
    first_accepted_w: float = 0.0  # discounted rounds whose first draft token was accepted
    first_judged_w: float = 0.0  # discounted rounds that judged a first draft token
    first_accepted: int = 0
    first_judged: int = 0
    draft_per_token: Optional[float] = None  # seconds per drafted token (EMA); None: never measured
    catch_up: float = 0.0  # seconds per token fed before drafting (a draft model catching up; EMA)
    catch_up_timed: bool = False  # catch_up comes from a real catch-up, not from the drafter's seed
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    judged: int = 0
    off_steps: int = 0  # rounds since this source last drafted
    credit: float = 0.0  # probe budget earned while passed over (verify_cost's units)
    follow: int = 0  # after a fully accepted probe: the length of the follow-up probe due next round

    @property
    def accept(self) -> float:
        """Estimated probability that the next drafted token is accepted (per token, geometric model)."""
        return self.accepted_w / self.judged_w

    @property
    def first_accept(self) -> float:
        """Estimated probability that a round's first draft token is accepted (shrunk toward `accept`)."""
        return (self.first_accepted_w + FIRST_PRIOR * self.accept) / (self.first_judged_w + FIRST_PRIOR)

    @property
    def long_run_accept(self) -> float:
        return (self.accepted + PRIOR_ACCEPT * PRIOR_TRIALS) / (self.judged + PRIOR_TRIALS)

    @property
    def long_run_first(self) -> float:
        return (self.first_accepted + FIRST_PRIOR * self.long_run_accept) / (self.first_judged + FIRST_PRIOR)

    def observe(self, proposed: int, accepted: int) -> None:
        judged = accepted + (1 if accepted < proposed else 0)  # tokens after the first rejection were never judged
        self.accepted_w = DISCOUNT * self.accepted_w + accepted
        self.judged_w = DISCOUNT * self.judged_w + judged
        self.rounds, self.proposed, self.accepted, self.judged = (
            self.rounds + 1, self.proposed + proposed, self.accepted + accepted, self.judged + judged)
        if proposed:
            hit = 1 if accepted else 0
            self.first_accepted_w = DISCOUNT * self.first_accepted_w + hit
            self.first_judged_w = DISCOUNT * self.first_judged_w + 1
            self.first_accepted, self.first_judged = self.first_accepted + hit, self.first_judged + 1

    def idle(self) -> None:
        """Offered but not chosen: drift back toward the long-run acceptance."""
        target = self.long_run_accept * self.judged_w
        self.accepted_w += IDLE_PULL * (target - self.accepted_w)
        target = self.long_run_first * self.first_judged_w
        self.first_accepted_w += IDLE_PULL * (target - self.first_accepted_w)


@dataclass
class Policy:
    """Chooses (source, k) each round; `adaptive=False` always drafts k_max from the first source offered.

    One Policy can serve many generations (a session keeps it), so later turns start from what
    earlier turns measured.
    """

    k_max: int
    adaptive: bool = True
    verify: Dict[int, float] = field(default_factory=dict)  # seconds per verify of k drafts (EMA)
    verify_n: Dict[int, int] = field(default_factory=dict)  # timings behind each verify[k]
    sources: Dict[str, SourceStats] = field(default_factory=dict)
    rounds: int = 0  # target passes recorded, plain or speculative
    probing: Optional[str] = None  # the source of the probe round chosen last, until its update
    plain_age: int = 0  # rounds since a plain step was last measured
    pad: bool = False  # the engine may pad a verify pass with dummy positions (`padded`): a plain KV cache

    def stats(self, source: str) -> SourceStats:
        return self.sources.setdefault(source, SourceStats())

    def verify_cost(self, k: int) -> float:
        """Seconds (or relative units before any measurement) to verify k drafts in one target pass: at the size
        measured cheapest among k and the larger ones it may be padded to (`padded`)."""
        cost = self._size_cost(k)
        if self.pad and k:
            cost = min([cost] + [v for j, v in self.verify.items() if j > k])
        return cost

    def verify_seconds(self, k: int) -> Optional[float]:
        """`verify_cost` in seconds, or None before a plain step has been timed (until then it is in relative
        units)."""
        return self.verify_cost(k) if 0 in self.verify else None

    def padded(self, k: int) -> int:
        """The draft count to run the verify pass of k drafts at (the rest dummy positions the engine trims): k,
        or a larger measured size that cost less, or once, a PAD_SIZES size not measured yet."""
        if not self.pad or k < PAD_FROM:
            return k
        nearest = min((j for j in PAD_SIZES if j > k), default=None)
        if nearest is not None and nearest not in self.verify:
            return nearest
        cheaper = [j for j, v in self.verify.items() if j > k and v < self._size_cost(k)]
        return min(cheaper, key=lambda j: self.verify[j]) if cheaper else k

    def _size_cost(self, k: int) -> float:
        """The cost of a verify pass over exactly k drafts: measured, or interpolated between measured sizes."""
        if k in self.verify:
            return self.verify[k]
        known = sorted(self.verify)
        if not known:
            return 1.0 + PRIOR_VERIFY_SLOPE * k  # relative units: only ratios matter
        lo = max((j for j in known if j < k), default=None)
        hi = min((j for j in known if j > k), default=None)
        if lo is not None and hi is not None:  # interpolate between measured sizes
            w = (k - lo) / (hi - lo)
            return self.verify[lo] * (1 - w) + self.verify[hi] * w
        ref = lo if lo is not None else hi
        return self.verify[ref] * (1 + PRIOR_VERIFY_SLOPE * k) / (1 + PRIOR_VERIFY_SLOPE * ref)

    def round_cost(self, k: int, source: str = "", lag: int = 0) -> Tuple[float, float]:
        """(whole round, drafting part) of a round drafting k tokens from `source`, in verify_cost's units.

        lag: the tokens the source must feed before it drafts (`Drafter.lag`), costed at its measured catch-up
        per token: after a long pause (or before its first use, when it has the whole prompt to feed) a draft
        model's round costs far more than the one before.
        """
        if k == 0:
            return self.verify_cost(0), 0.0
        s = self.stats(source)
        drafting = s.catch_up * lag + k * (s.draft_per_token or 0.0)
        return self.verify_cost(k) + drafting, drafting

    def expected_tokens(self, k: int, source: str = "", accept: Optional[float] = None,
                        cautious: bool = False) -> float:
        """Expected tokens from a round drafting k tokens from `source` (at `accept` for every draft token, default
        the source's estimates; `cautious`: the lower of the recent and the long-run ones)."""
        if k == 0:
            return 1.0
        s = self.stats(source)
        a = min(s.accept if accept is None else accept, 0.999)
        p = s.first_accept if accept is None else accept
        if cautious and accept is None:
            a, p = min(a, s.long_run_accept), min(p, s.long_run_first)
        return 1 + p * (1 - a ** k) / (1 - a)

    def expected_rate(self, k: int, source: str = "", lag: int = 0, accept: Optional[float] = None,
                      cautious: bool = False, horizon: Optional[int] = None) -> float:
        """Expected tokens per second (or per relative unit) of a round drafting k tokens from `source`
        (`expected_tokens`); horizon: spread the catch-up of `lag` tokens over that many output tokens
        (`amortized`), else charge it all to this round."""
        if k == 0:
            return 1.0 / self.verify_cost(0)
        tokens = self.expected_tokens(k, source, accept, cautious)
        return tokens / self.round_cost(k, source, self.amortized(lag, tokens, horizon))[0]

    @staticmethod
    def amortized(lag: float, tokens: float, horizon: Optional[int]) -> float:
        """The part of a catch-up of `lag` tokens that a round yielding `tokens` pays, when the catch-up serves the
        next `horizon` output tokens: a catch-up is paid once, and every later round of the source starts caught
        up. Charged whole to the first round, a draft model that sat out a long copy of the suffix source was never
        worth its catch-up again: in the engine2 run of revision 9143f65 the hybrid's 0.5B (9 of 10 tokens agreed
        in hindsight) was 100 tokens behind when HumanEval/12's copy ended, 0.6 s to feed against 0.44 s a plain
        step, and the last 23 tokens of the reply were decoded plainly (BENCHMARKS.md §19)."""
        if not horizon or not lag:
            return lag
        return lag * min(1.0, tokens / horizon)

    def ranked_rate(self, k: int, source: str, lag: int = 0, horizon: Optional[int] = None) -> float:
        """expected_rate discounted by the share of the round spent drafting (COST_MARGIN): ranks sources only."""
        tokens = self.expected_tokens(k, source)
        whole, drafting = self.round_cost(k, source, self.amortized(lag, tokens, horizon))
        return tokens / whole / (1 + COST_MARGIN * drafting / whole)  # expected_rate, from the same round cost

    def pays_back(self, source: str, lag: int, remaining: int) -> bool:
        """Could drafting from `source` for the `remaining` tokens save more than its catch-up of `lag` tokens costs?

        An upper bound: every draft accepted, at the best length. A draft model whose own step costs about a
        target step (an int8 or int4 draft on a CPU without fast quantized matmuls) cannot save anything, and
        one whose prompt costs more to feed than the rest of the reply could save is not worth feeding it:
        such a source is neither probed nor fed (on this CPU the int8 0.5B's prompt took 57 s of a 102 s
        reply that drafted 1-25 tokens). Unknown costs: assume it pays.
        """
        s = self.stats(source)
        if s.draft_per_token is None or 0 not in self.verify:
            return True
        plain = self.verify_cost(0)
        best = max(self.expected_rate(k, source, accept=1.0) for k in range(1, self.k_max + 1))
        saving = remaining * (plain - (1 + MARGIN) / best)
        return saving > s.catch_up * lag

    def seed(self, source: str, draft_per_token: Optional[float], catch_up: Optional[float]) -> None:
        """A source's costs as the drafter measured them before drafting (`Drafter.step_cost`): seconds per
        drafted token and per token of catch-up, so the policy can rule out a source before it pays for
        feeding the prompt. Measurements made while drafting take over from these."""
        s = self.stats(source)
        if s.draft_per_token is None and draft_per_token is not None:
            s.draft_per_token = draft_per_token
        if not s.catch_up and catch_up is not None:
            s.catch_up = catch_up

    def choose(self, offers: Dict[str, int], limit: int, lags: Optional[Dict[str, int]] = None) -> Tuple[str, int]:
        """(source, k) for the next round; ("", 0) is a plain step.

        offers: each source that could draft now -> the most tokens it could draft (`Drafter.sources`).
        limit: the most draft tokens the round may have (tokens left to generate minus one).
        lags: each source -> the tokens it must feed before drafting (`Drafter.lag`); missing: 0.
        """
        self.probing = None
        lags, remaining = lags or {}, limit + 1
        limit = min(limit, self.k_max)
        caps = {src: min(cap, limit) for src, cap in offers.items() if min(cap, limit) > 0}
        if not caps:
            return "", 0
        if not self.adaptive:
            src = next(iter(caps))
            return src, caps[src]
        if 0 not in self.verify:
            # Measure a plain step first: it is the baseline every draft must beat, and guessing it from a
            # verify of several tokens misleads (on this CPU verifying 2 tokens costs 1.2-1.45x verifying 1, so a
            # policy that started by drafting guessed plain steps too slow and kept drafting at a loss).
            return "", 0
        caps = {src: cap for src, cap in caps.items() if self.pays_back(src, lags.get(src, 0), remaining)}
        fresh = [src for src in caps if self.stats(src).rounds == 0]
        for src in fresh:  # a new source drafts a short probe first: its cost, then its odds
            if not lags.get(src, 0):
                return self._probe(src, min(PROBE_K, caps[src]))
        floor = self.expected_rate(0) * (1 + MARGIN)  # drafting at all must beat plain by MARGIN
        horizon = min(remaining, CATCH_UP_HORIZON)  # the output a catch-up paid now serves (`amortized`)
        best, best_rank = ("", 0), 0.0
        for src, cap in caps.items():  # each source's best length, then the sources ranked against each other
            if src in fresh:
                continue
            lag = lags.get(src, 0)
            k = max(range(1, cap + 1), key=lambda j: self.expected_rate(j, src, lag, horizon=horizon))
            rank = self.ranked_rate(k, src, lag, horizon)
            if rank > best_rank and self.expected_rate(k, src, lag, cautious=True, horizon=horizon) > floor:
                best, best_rank = (src, k), rank
        if best[1] == 0 and fresh:  # nothing else would draft: now a new source's catch-up is worth a look
            return self._probe(fresh[0], min(PROBE_K, caps[fresh[0]]))
        if (best[1] > 0 and self.plain_age >= RECHECK_EVERY
                and self.expected_rate(best[1], best[0], lags.get(best[0], 0), horizon=horizon)
                < floor * (1 + RECHECK)):
            return "", 0  # a marginal draft: is the baseline it beats still what a plain step costs?
        if best[1] > 0:
            s = self.stats(best[0])
            s.off_steps, s.credit, s.follow = 0, 0.0, 0
        spent = self.round_cost(best[1], best[0], lags.get(best[0], 0))[0]
        for src in caps:
            if src != best[0]:
                s = self.stats(src)
                s.idle()
                s.off_steps += 1
                s.credit += PROBE_BUDGET * spent
        for src, cap in caps.items():  # while nothing drafts, a fully accepted probe is followed by a longer one
            s = self.stats(src)
            if best[1] == 0 and s.follow:
                k = min(s.follow, cap)
                if self.follow_pays(src, k, lags.get(src, 0)):
                    return self._probe(src, k)
                s.follow = 0
        for src, cap in caps.items():  # probe a source passed over once its credit pays for the probe
            s = self.stats(src)
            if (src != best[0] and s.off_steps >= PROBE_MIN
                    and s.credit >= self.probe_loss(src, best, lags.get(src, 0), horizon)):
                return self._probe(src, min(PROBE_K, cap))
        return best

    def follow_pays(self, source: str, k: int, lag: int = 0) -> bool:
        """Whether a follow-up probe of k tokens could beat plain decoding at the better of the source's recent and
        long-run acceptance: a follow-up is not paid from the probe budget, so it is a bet that the source has
        become good, and a source that would lose even at the best odds it has shown is not worth the bet. The
        self drafter (half the target's layers, 0.29-0.39 s a draft token against 0.59 s a target step on this
        CPU, 67 % of first tokens accepted) lost 8.2 s in its 34 rounds of 2-4 drafts over the first 5 prompts of
        the engine2 run of revision 134a3b6; at its costs a 2-token round needs about 80 % acceptance to pay."""
        s = self.stats(source)
        odds = max(s.accept, s.long_run_accept)
        return self.expected_rate(k, source, lag, accept=odds) > self.expected_rate(0) * (1 + MARGIN)

    def _probe(self, source: str, k: int) -> Tuple[str, int]:
        s = self.stats(source)
        s.off_steps, s.credit, s.follow = 0, 0.0, 0
        self.probing = source
        return source, k

    def probe_loss(self, source: str, instead: Tuple[str, int], lag: int = 0, horizon: Optional[int] = None) -> float:
        """Expected time a probe round of `source` loses against the round `instead` (src, k) for the same tokens,
        its catch-up of `lag` tokens included (spread over `horizon` output tokens, `amortized`, as in choosing).

        Costed at the lower of the recent and the long-run first-token acceptance: the long-run one starts from
        the optimistic prior, and a source whose probes keep failing (the self drafter on code edits probed 7-16
        times per 128-token reply, 0.80-0.96x of plain) must not be re-probed on the strength of that prior.
        Charged whole, the catch-up grows with every round sat out, so a passed-over draft model was re-probed
        only while its per-token catch-up stayed below the probe budget's share of a round; timed on 1-token
        catch-ups it read 0.034 s a token, 5 % of a plain step, and the 0.5B (90 % accepted on a code edit) was
        never probed again for the last 53 rounds of the reply: catch-ups under CATCH_UP_MIN tokens are not timed.
        Leaving the catch-up out altogether probed back there, but drafted more on open prose questions, at up to
        5.5 s more a reply (BENCHMARKS.md §8). Charged whole, a catch-up that grows by 0.0066 s a round sat out
        against credit earned at 0.009 s a round kept the hybrid's 0.5B, 90 tokens behind after a suffix copy, from
        ever being probed again (HumanEval/16 of the engine2 run of 9143f65: 33 of the 47 rounds after the copy
        plain, the 0.5B back in the last three); a catch-up is paid once per output token however it is split,
        and it buys the probe's hindsight over them (BENCHMARKS.md §19).
        """
        s = self.stats(source)
        a = min(s.first_accept, s.long_run_first)  # a probe drafts one token: a first token
        whole = self.round_cost(PROBE_K, source, self.amortized(lag, 1 + a, horizon))[0]
        return max(0.0, whole - (1 + a) / self.expected_rate(instead[1], instead[0]))

    def observe(self, source: str, proposed: int, accepted: int) -> None:
        """Record how a shadow draft of a free source fared (it was judged against the round's output but
        not verified): its acceptance is now current, so it needs no probe."""
        s = self.stats(source)
        s.observe(proposed, accepted)
        s.off_steps, s.credit = 0, 0.0

    def hindsight(self, source: str, matches: Sequence[bool]) -> None:
        """Record what greedy drafts from `source` would have done over output it sat out: `matches[i]` says
        whether its prediction was the i-th token (`Draft.hindsight`, judged when a draft model catches up).

        Replayed as the rounds drafting would have made, k_max tokens each: each round accepts the matches
        up to the first miss, whose token the target supplies, and the next round starts after it. So a probe
        that feeds 40 sat-out tokens judges 40, not one: a draft model rejected early in a reply and good
        since (the 0.5B on code edits whose first lines are rewritten) can be back on after one probe, and one
        that stays poor (on open prose) is judged on many tokens, not on one lucky probe.
        """
        s, i = self.stats(source), 0
        while i < len(matches):
            k = min(self.k_max, len(matches) - i)
            m = 0
            while m < k and matches[i + m]:
                m += 1
            s.observe(k, m)
            i += m + 1

    def update(self, source: str, proposed: int, accepted: int, verify_s: float, draft_s: float,
               catch_up_s: float = 0.0, catch_up_tokens: int = 0, verified: Optional[int] = None) -> None:
        """Record one round: `accepted` of `proposed` drafts from `source`, and what verify and drafting cost
        (draft_s includes catch_up_s, the time feeding the catch_up_tokens the source was behind); verified: the
        size the verify pass ran at (`padded`), if not `proposed`."""
        self.rounds += 1
        size = proposed if verified is None else verified
        n = self.verify_n[size] = self.verify_n.get(size, 0) + 1
        w = max(EMA, 1 / n)  # the first few timings are averaged: one slow first step must not stand for many
        self.verify[size] = (1 - w) * self.verify.get(size, 0.0) + w * verify_s
        self.plain_age = 0 if proposed == 0 else self.plain_age + 1
        if proposed == 0:
            return
        s = self.stats(source)
        s.observe(proposed, accepted)
        if source == self.probing:  # all accepted: the source may have become good, so look again, longer
            s.follow = min(2 * proposed, self.k_max) if accepted == proposed else 0
            self.probing = None
        per_tok = max(draft_s - catch_up_s, 0.0) / proposed
        first = s.draft_per_token is None
        s.draft_per_token = per_tok if first else (1 - EMA) * s.draft_per_token + EMA * per_tok
        if catch_up_tokens >= CATCH_UP_MIN:  # the first one replaces the seed: a short pass on a scratch cache
            per_tok = catch_up_s / catch_up_tokens
            s.catch_up = (1 - EMA) * s.catch_up + EMA * per_tok if s.catch_up_timed else per_tok
            s.catch_up_timed = True
