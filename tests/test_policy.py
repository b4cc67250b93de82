"""The draft policy: it picks the source and length that pay, switches drafting off when nothing pays, and probes back."""

import pytest

from mlx_spec.gen.policy import MARGIN, PROBE_BUDGET, PROBE_K, PROBE_MIN, RECHECK_EVERY, Policy

STEP = 0.5  # seconds per plain target step


def feed(policy, source, k, accepted, draft_per_token, verify=STEP, rounds=10):
    for _ in range(rounds):
        policy.update(source, k, accepted, verify * (1 + 0.05 * k), draft_per_token * k)
    policy.update("", 0, 0, verify, 0.0)


def test_plain_decoding_is_measured_first_then_a_new_source_gets_a_short_probe():
    p = Policy(7)
    assert p.choose({"model": 1 << 30}, 100) == ("", 0)  # the baseline every draft must beat
    p.update("", 0, 0, STEP, 0.0)
    assert p.choose({"model": 1 << 30}, 100) == ("model", PROBE_K)
    assert p.choose({"ngram": 1}, 100) == ("ngram", 1)  # never more than the source can draft


def test_a_good_cheap_source_drafts_long():
    p = Policy(7)
    feed(p, "ngram", 7, 7, 0.0001)
    src, k = p.choose({"ngram": 7}, 100)
    assert src == "ngram" and k == 7
    assert p.choose({"ngram": 3}, 100) == ("ngram", 3)  # capped by what the table can chain
    assert p.choose({"ngram": 7}, 2) == ("ngram", 2)  # and by the tokens left


def test_drafting_switches_off_when_it_does_not_pay_and_probes_back():
    p = Policy(6)
    feed(p, "self", 4, 0, STEP * 0.5)  # half a step per draft token, nothing accepted
    choices = [p.choose({"self": 1 << 30}, 1000) for _ in range(200)]
    plain = sum(k == 0 for _, k in choices)
    probes = [c for c in choices if c[1] > 0]
    assert plain >= len(choices) - 10 and probes  # off, with a rare probe
    assert all(k == PROBE_K for _, k in probes)
    assert choices.index(probes[0]) >= PROBE_MIN - 1  # never before PROBE_MIN plain rounds
    for _ in range(10):  # acceptance recovers: drafting comes back on
        p.update("self", 2, 2, STEP * 1.1, STEP * 0.1 * 2)
    assert p.choose({"self": 1 << 30}, 1000)[1] > 0


def _probes(p, accept_probes, n=400, verify1=STEP * 1.45, draft=STEP * 0.4):
    """Run n rounds of a source that is off; return (probe rounds, seconds lost to probes vs plain, total seconds)."""
    probes, lost, total = 0, 0.0, 0.0
    for _ in range(n):
        src, k = p.choose({"model": 1 << 30}, 1000)
        if k:
            probes += 1
            a = k if accept_probes else 0
            p.update(src, k, a, verify1, draft * k)
            total += verify1 + draft * k
            lost += verify1 + draft * k - (1 + a) * STEP
        else:
            p.update("", 0, 0, STEP, 0.0)
            total += STEP
    return probes, lost, total


def test_probes_cost_at_most_their_budget_and_come_sooner_when_they_are_accepted():
    """A costly source that does not pay (a 1-token verify at 1.45 steps, a draft at 0.4: the 0.5B on this CPU)
    probes rarely enough that probes lose at most ~PROBE_BUDGET of the time; accepted probes come more often."""
    p = Policy(6)
    feed(p, "model", 4, 0, STEP * 0.4)
    probes, lost, total = _probes(p, accept_probes=False)
    assert probes >= 2 and lost / total <= PROBE_BUDGET * 1.5
    q = Policy(6)
    feed(q, "model", 4, 0, STEP * 0.4)
    more, _, _ = _probes(q, accept_probes=True)
    assert more > probes


def test_a_free_source_probes_more_often_than_a_costly_one():
    counts = []
    for draft in (0.0, STEP * 0.4):
        p = Policy(6)
        feed(p, "model", 4, 0, draft)
        counts.append(_probes(p, accept_probes=False, draft=draft)[0])
    assert counts[0] > counts[1]


def test_the_policy_picks_the_source_that_pays_more():
    p = Policy(7)
    feed(p, "ngram", 7, 1, 0.0001)  # free but mostly wrong
    feed(p, "model", 6, 6, STEP * 0.1)  # costs a tenth of a step, almost always right
    assert p.choose({"ngram": 7, "model": 1 << 30}, 100)[0] == "model"
    q = Policy(7)
    feed(q, "ngram", 7, 7, 0.0001)
    feed(q, "model", 6, 6, STEP * 0.4)
    assert q.choose({"ngram": 7, "model": 1 << 30}, 100)[0] == "ngram"


def test_each_source_is_judged_by_its_own_statistics():
    p = Policy(7)
    feed(p, "ngram", 7, 0, 0.0001)
    feed(p, "model", 6, 6, STEP * 0.1)
    assert p.sources["ngram"].accept < 0.1 < 0.9 < p.sources["model"].accept
    assert p.sources["ngram"].draft_per_token < p.sources["model"].draft_per_token


def test_not_adaptive_always_drafts_the_most_from_the_first_source():
    p = Policy(5, adaptive=False)
    feed(p, "ngram", 5, 0, 1.0)
    assert p.choose({"ngram": 3, "model": 1 << 30}, 100) == ("ngram", 3)
    assert p.choose({}, 100) == ("", 0)
    assert p.choose({"model": 1 << 30}, 0) == ("", 0)


@pytest.mark.parametrize("accept", [0.3, 0.6, 0.9])
def test_expected_rate_matches_the_geometric_model(accept):
    p = Policy(8)
    p.verify = {0: 1.0, 4: 1.0}
    m = p.stats("m")
    m.accepted_w, m.judged_w, m.draft_per_token = accept * 10, 10.0, 0.0
    assert p.expected_rate(4, "m") == pytest.approx(sum(accept ** i for i in range(5)))


def test_acceptance_is_estimated_per_token_not_per_round():
    """Rounds of 7/7 and 0/7 alternate: 7 of 8 judged tokens were accepted. A per-round average says 0.5."""
    p = Policy(7)
    for _ in range(10):
        p.update("ngram", 7, 7, STEP, 0.0)
        p.update("ngram", 7, 0, STEP, 0.0)
    assert p.sources["ngram"].accept > 0.8


def test_a_source_passed_over_drifts_back_to_its_long_run_acceptance():
    p = Policy(7)
    for _ in range(20):
        p.update("ngram", 7, 6, STEP, 0.0)  # a good source for a long time
    for _ in range(10):
        p.update("ngram", 7, 0, STEP, 0.0)  # then a bad patch
    low = p.sources["ngram"].accept
    feed(p, "model", 6, 6, STEP * 0.1, rounds=3)  # a rival that wins while the n-gram looks bad
    assert low < 0.45 and p.choose({"ngram": 7, "model": 1 << 30}, 100)[0] == "model"
    picks = [p.choose({"ngram": 7, "model": 1 << 30}, 100)[0] for _ in range(30)]
    assert "ngram" in picks  # not starved: it is tried again
    assert p.sources["ngram"].accept > low


def test_marginal_drafting_is_not_worth_it():
    p = Policy(1)
    p.verify = {0: 1.0, 1: 1.0}
    m = p.stats("m")
    m.draft_per_token, m.rounds = 0.0, 1  # measured
    gain = 1.0 + MARGIN / 2  # expected tokens per round with k=1: 1 + accept
    m.accepted_w, m.judged_w = (gain - 1) * 10, 10.0
    m.off_steps = -1000  # no probe in this test
    assert p.choose({"m": 1}, 100) == ("", 0)
    m.accepted_w = 3.0  # 1.3 tokens per round: clearly pays
    assert p.choose({"m": 1}, 100) == ("m", 1)


def test_a_costly_source_must_beat_a_free_one_by_a_margin():
    """Equal expected rates: the free n-gram chain wins; the model wins only when clearly better."""
    p = Policy(7)
    p.verify = {0: 1.0, 1: 1.0, 2: 1.0, 4: 1.0}
    ngram, model = p.stats("ngram"), p.stats("model")
    ngram.rounds = model.rounds = 1  # both measured
    ngram.draft_per_token, ngram.accepted_w, ngram.judged_w = 0.0, 7.0, 10.0  # 2 drafts: 1 + .7 + .49 = 2.19
    model.draft_per_token = 0.2  # 4 drafts: the round costs 1.8, 44 % of it drafting
    model.accepted_w, model.judged_w = 9.0, 10.0  # 1 + .9 + ... + .9^4 = 4.1 tokens -> 2.28 per unit: slightly more
    assert p.expected_rate(4, "model") > p.expected_rate(2, "ngram")
    assert p.choose({"ngram": 2, "model": 4}, 100) == ("ngram", 2)
    model.draft_per_token = 0.05  # cheap enough that its higher rate is real
    assert p.choose({"ngram": 2, "model": 4}, 100) == ("model", 4)
    assert p.choose({"model": 4}, 100) == ("model", 4)  # alone, its length is not shortened by the margin


def test_a_fully_accepted_probe_is_followed_at_once_by_a_longer_one_until_one_fails():
    p = Policy(8)
    feed(p, "model", 4, 4, STEP * 0.4)  # good for a while ...
    feed(p, "model", 4, 0, STEP * 0.4, rounds=8)  # ... then off: nothing accepted lately
    assert p.choose({"model": 4}, 100)[1] == 0
    lengths = []
    for _ in range(400):
        src, k = p.choose({"model": 1 << 30}, 1000)
        if k:
            lengths.append(k)
            p.update(src, k, k if len(lengths) < 3 else 0, STEP * 1.45, STEP * 0.4 * k)
            if len(lengths) == 4:
                break
        else:
            p.update("", 0, 0, STEP, 0.0)
    # 1 accepted -> 2 at once, accepted -> 4 at once, rejected -> back to a budgeted one-token probe
    assert lengths[:3] == [PROBE_K, 2 * PROBE_K, 4 * PROBE_K] and lengths[3] == PROBE_K


def test_no_follow_up_for_a_source_that_could_not_pay_at_the_best_odds_it_has_shown():
    """A self draft at half a target step per token, two thirds of its tokens accepted: a 2-token round needs
    about 80 % to pay, so an accepted one-token probe is not followed by a longer one (the bet is not paid from
    the probe budget; the test above has a source whose odds make the bet)."""
    p = Policy(8)
    p.update("", 0, 0, STEP, 0.0)
    for i in range(30):  # rounds of one draft, accepted two times in three
        p.update("self", 1, int(i % 3 < 2), STEP * 1.1, STEP * 0.5)
    for _ in range(3):
        p.update("", 0, 0, STEP, 0.0)
    lengths = []
    for _ in range(400):
        src, k = p.choose({"self": 8}, 1000)
        if k:
            lengths.append(k)
            p.update(src, k, k, STEP * 1.1 * (1 + 0.05 * k), STEP * 0.5 * k)  # every probe accepted
            if len(lengths) == 2:
                break
        else:
            p.update("", 0, 0, STEP, 0.0)
    assert lengths == [PROBE_K, PROBE_K]  # the next probe is a budgeted one-token probe again


def test_a_source_whose_probes_keep_failing_is_probed_on_its_recent_acceptance_not_its_prior():
    p = Policy(6)
    p.update("", 0, 0, STEP, 0.0)
    for _ in range(3):  # three probes rejected: recent acceptance near 0, long-run still lifted by the prior
        p.update("self", 1, 0, STEP * 1.45, STEP * 0.5)
    s = p.stats("self")
    assert s.accept < s.long_run_accept and s.first_accept < s.long_run_first
    whole = p.round_cost(PROBE_K, "self")[0]
    assert p.probe_loss("self", ("", 0)) == pytest.approx(whole - (1 + s.first_accept) * p.verify_cost(0))


def test_first_tokens_that_keep_failing_shorten_a_source_whose_continuations_hold():
    """Drafts fail together: an n-gram chain rejected at its first token round after round (its continuations
    accepted whenever the first token was) must not keep drafting 7 tokens at 1.9x a plain step's cost."""
    p = Policy(7)
    p.update("", 0, 0, STEP, 0.0)
    for _ in range(6):  # a copy stretch: every token accepted
        p.update("ngram", 7, 7, STEP * 1.3, 0.0)
    for _ in range(4):  # the line is being rewritten: first token rejected, every round
        p.update("ngram", 7, 0, STEP * 1.9, 0.0)
    s = p.stats("ngram")
    assert s.first_accept < 0.6 * s.accept  # the per-token count barely moved; the first-token one did
    src, k = p.choose({"ngram": 7}, 100)
    assert k < 7  # a shorter draft, or none

    fresh = Policy(7)  # no rounds seen: the first-token estimate is the per-token one (the geometric model)
    assert fresh.stats("x").first_accept == pytest.approx(fresh.stats("x").accept)


def test_a_source_that_cannot_pay_back_its_catch_up_is_not_fed_it():
    """A draft model 100 tokens behind (its prompt not fed yet): fed when the reply is long enough to repay it."""
    p = Policy(6)
    p.update("", 0, 0, STEP, 0.0)
    p.seed("model", STEP * 0.2, STEP * 0.1)  # a draft step at 0.2 steps; a token of catch-up at 0.1
    assert p.choose({"model": 1 << 30}, 1000, {"model": 100}) == ("model", PROBE_K)  # a long reply repays it
    q = Policy(6)
    q.update("", 0, 0, STEP, 0.0)
    q.seed("model", STEP * 0.2, STEP * 0.1)
    assert q.choose({"model": 1 << 30}, 10, {"model": 100}) == ("", 0)  # 11 tokens cannot repay 10 steps
    assert q.choose({"model": 1 << 30}, 10, {"model": 2}) == ("model", PROBE_K)  # a short catch-up can
    r = Policy(6)
    r.update("", 0, 0, STEP, 0.0)
    r.seed("model", STEP * 1.1, 0.0)  # a draft step dearer than a target step: no reply repays it
    assert all(r.choose({"model": 1 << 30}, 1000, {"model": 0}) == ("", 0) for _ in range(300))


def run(policy, source, cap, accept_every, verify_per_token, draft_per_token, rounds):
    """Rounds with true costs: a plain step costs STEP, a round of k drafts STEP * (1 + verify_per_token * k) plus
    its drafting; every `accept_every`-th drafted token is rejected (0: all accepted). Returns the choices."""
    choices, n = [], 0
    for _ in range(rounds):
        src, k = policy.choose({source: cap}, 1000)
        choices.append((src, k))
        accepted = 0
        for _ in range(k):
            n += 1
            if accept_every and n % accept_every == 0:
                break
            accepted += 1
        policy.update(src, k, accepted, STEP * (1 + verify_per_token * k), draft_per_token * k)
    return choices


def test_a_baseline_measured_high_once_is_measured_again_while_drafting_is_marginal():
    """A first plain step timed 30 % slow made a losing drafter look good; re-measuring plain fixes it."""
    p = Policy(6)
    p.update("", 0, 0, 1.3 * STEP, 0.0)  # the one plain measurement: an outlier
    # Half a step per draft token, 1 in 2 drafted tokens rejected: about 0.9x of plain at any length.
    choices = run(p, "self", 1 << 30, 2, 0.2, 0.5 * STEP, 120)
    first_plain = next(i for i, (_, k) in enumerate(choices) if k == 0)
    assert first_plain <= RECHECK_EVERY + 2  # re-measured soon, not never
    assert p.verify[0] < 1.1 * STEP  # the baseline moved to the truth
    assert sum(k == 0 for _, k in choices[-60:]) >= 50  # and the losing drafter is off


def test_a_drafter_well_ahead_of_plain_is_never_interrupted_to_re_measure_it():
    p = Policy(7)
    p.update("", 0, 0, 1.3 * STEP, 0.0)
    choices = run(p, "ngram", 7, 0, 0.05, 0.0001, 100)  # free, every token accepted: far ahead of plain
    assert all(k > 0 for _, k in choices)


def test_a_new_source_that_must_catch_up_waits_for_a_round_nothing_else_drafts():
    """A hybrid copying with its suffix source does not pay to feed a draft model its prompt; it does once the
    copy ends. A new source with nothing to catch up is probed at once, as before."""
    p = Policy(7)
    feed(p, "suffix", 7, 7, 0.0)  # copying: every token accepted
    p.seed("model", STEP * 0.4, STEP * 0.02)
    offers, lags = {"suffix": 7, "model": 6}, {"suffix": 0, "model": 200}
    assert p.choose(offers, 1000, lags) == ("suffix", 7)
    assert p.choose({"model": 6}, 1000, lags) == ("model", PROBE_K)  # the copy ended: only the model offers
    q = Policy(7)
    feed(q, "suffix", 7, 7, 0.0)
    assert q.choose({"suffix": 7, "self": 6}, 1000, {"self": 0}) == ("self", PROBE_K)


def _behind(lag_cost):
    """A draft model that pays well when caught up (11 of 12 drafts accepted, 0.3 steps a draft token), with a
    catch-up of `lag_cost` steps a token."""
    p = Policy(6)
    p.update("", 0, 0, STEP, 0.0)
    p.seed("model", None, lag_cost * STEP)
    for i in range(10):
        p.update("model", 6, 6 if i % 2 else 5, STEP * 1.6, STEP * 0.3 * 6)
    p.update("", 0, 0, STEP, 0.0)
    return p


def test_a_catch_up_is_spread_over_the_output_it_serves_not_charged_to_one_round():
    """The hybrid's 0.5B sat out a 100-token copy of the suffix source; fed that (3 plain steps here), it drafts the
    rest of the reply at about 1.4x plain. Charged whole to the next round, every round looked slower than plain, and
    the rest of the reply was decoded plainly."""
    p = _behind(0.03)
    assert p.expected_rate(6, "model", 100) < p.expected_rate(0) * (1 + MARGIN) < p.expected_rate(6, "model", 0)
    src, k = p.choose({"model": 6}, 1000, {"model": 100})
    assert src == "model" and k >= 4
    q = _behind(0.03)  # the reply is about to end: too few tokens left to repay the catch-up
    assert q.choose({"model": 6}, 3, {"model": 100}) == ("", 0)
    r = _behind(0.2)  # a catch-up of 20 steps is not repaid within the horizon either
    assert r.choose({"model": 6}, 1000, {"model": 100}) == ("", 0)


def rounds_until_probed(p, cap, lag, most=200):
    """Plain rounds a draft model sits out, `lag` tokens behind and one more each round, before it drafts again."""
    for rounds in range(1, most):
        if p.choose({"model": cap}, 1000, {"model": lag})[1]:
            return rounds
        p.update("", 0, 0, STEP, 0.0)
        lag += 1
    return most


def test_a_draft_model_sat_out_behind_a_long_copy_is_probed_again():
    """The hybrid's 0.5B failed its first token, then the suffix source copied 90 tokens: its catch-up (0.0066 s a
    token against a 0.46 s step) grew by about what a round sat out earns towards a probe, so charged whole it was
    never probed again. Spread over the output it would serve, it is probed within the usual interval."""
    p = Policy(15)
    p.update("", 0, 0, STEP, 0.0)
    p.update("model", 1, 0, STEP * 1.2, STEP * 0.3 + 0.7 * STEP, 0.7 * STEP, 93)  # its prompt: 93 tokens
    assert rounds_until_probed(p, 15, lag=90) < 60


def test_drafting_resumes_on_the_lower_of_the_recent_and_the_long_run_acceptance():
    """A source that pays only in lucky streaks: a few accepted drafts in a row must not switch on a source whose
    long-run odds do not beat plain."""
    p = Policy(6)
    p.update("", 0, 0, STEP, 0.0)
    for i in range(30):  # 60 % of first tokens accepted, over many rounds
        p.update("model", 1, 1 if i % 5 < 3 else 0, STEP * 1.2, STEP * 0.4)
    for _ in range(5):  # a streak
        p.update("model", 1, 1, STEP * 1.2, STEP * 0.4)
    s = p.stats("model")
    assert s.first_accept > s.long_run_first + 0.1
    assert p.expected_rate(1, "model") > p.expected_rate(0) * (1 + MARGIN) > p.expected_rate(1, "model", cautious=True)
    assert p.choose({"model": 6}, 1000)[1] == 0  # judged cautiously: plain


def test_short_catch_ups_are_not_timed_per_token_so_a_draft_model_sat_out_is_probed_again():
    """1-token catch-ups ride along in the first draft pass: timed per token they read 5x the real rate, and the
    probe cost of a sat-out draft model (its catch-up included) then outgrew the probe budget for good."""
    p = Policy(6)
    p.update("", 0, 0, STEP, 0.0)
    p.update("model", 4, 4, STEP * 1.2, STEP * 0.4 * 4 + 0.5, 0.5, 50)  # a 50-token catch-up: 0.01 s a token
    for accepted in (1, 0, 1):
        p.update("model", 1, accepted, STEP * 1.1, STEP * 0.4 + 0.05, 0.05, 1)  # 1-token catch-ups: not timed
    assert p.stats("model").catch_up == pytest.approx(0.01)
    assert rounds_until_probed(p, 6, lag=1) < 40  # probed again, the catch-up of every round sat out included


def test_a_timed_catch_up_replaces_the_seed():
    """The seed comes from a short pass on a scratch cache before drafting; the first catch-up long enough to time
    per token is the real rate, and blending the two kept the seed's weight (70 %) for the whole reply."""
    p = Policy(6)
    p.seed("model", 0.2, 0.03)
    p.update("", 0, 0, STEP, 0.0)
    p.update("model", 1, 1, STEP * 1.1, 0.2 + 1.2, 1.2, 132)  # the prompt's catch-up: 132 tokens in 1.2 s
    assert p.stats("model").catch_up == pytest.approx(1.2 / 132)
    p.update("model", 1, 1, STEP * 1.1, 0.2 + 0.2, 0.2, 10)  # later ones are smoothed as usual
    assert p.stats("model").catch_up == pytest.approx(0.7 * 1.2 / 132 + 0.3 * 0.02)


def test_a_verify_pass_is_padded_to_a_size_measured_cheaper():
    """OpenBLAS here: 16 positions cost less than 8 or 12. Each pad size is tried once, then used only where
    measured cheaper, and the draft-length choice sees the padded cost."""
    p = Policy(24)
    assert p.padded(6) == 6  # the engine has not allowed padding (a recurrent or rotating cache)
    p.pad = True
    assert p.padded(2) == 2  # too short to try
    for k, s in [(0, 0.51), (1, 0.65), (6, 0.94)]:
        p.update("" if k == 0 else "x", k, k, s, 0.0)
    assert p.padded(6) == 15  # 16 positions never measured: tried once
    p.update("x", 6, 6, 0.78, 0.0, verified=15)
    assert p.verify[15] == 0.78 and p.verify[6] == 0.94  # recorded at the size that ran
    assert p.padded(6) == 15 and p.padded(11) == 15 and p.verify_cost(6) == 0.78 and p.verify_cost(11) == 0.78
    assert p.verify_cost(1) == 0.65 and p.padded(1) == 1  # a size cheaper than the padded one stays as it is
    assert p.padded(20) == 31  # past 16: 32 positions, tried once
    p.update("x", 20, 20, 1.40, 0.0, verified=31)
    assert p.padded(20) == 20  # measured dearer than the interpolated 21 positions: not padded
    q = Policy(24, pad=True)
    for k, s in [(0, 0.010), (4, 0.012)]:
        q.update("" if k == 0 else "x", k, k, s, 0.0)
    q.update("x", 4, 4, 0.030, 0.0, verified=15)  # a GPU: 16 positions cost more than 5
    assert q.padded(4) == 4 and q.verify_cost(4) == 0.012
    assert not Policy(24, pad=False).pad
