"""Recorded rounds replayed: a recording's accepted lengths are the engine's, a replay under the pass-counting clock's
profile predicts the engine's time, the table is the same on every run, and profiles load or are refused."""

import json
from pathlib import Path

import mlx.core as mx
import pytest

from mlx_spec.bench import machines, replay
from mlx_spec.bench.recorded import CorpusPrompt, Recording, corpus, load, record
from mlx_spec.errors import MlxSpecError
from mlx_spec.gen.generate import Stats, speculative_generate_step
from mlx_spec.named import load_model, make_drafter

PROMPTS = [
    CorpusPrompt("edit/a", "edit", "Add a docstring:\n```python\ndef add(a, b):\n    return a + b\n```"),
    CorpusPrompt("question/b", "question", "Why is the sky blue?"),
    CorpusPrompt(
        "chat/c",
        "chat",
        messages=(
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "def sub(a, b):"},
        ),
    ),
]
TOKENS = 32


def _near(src: Path, dst: Path, noise: float, seed: int = 7) -> Path:
    """A copy of a model whose weights carry relative noise: a draft that agrees with it on most tokens, not all."""
    import shutil

    shutil.copytree(src, dst)
    mx.random.seed(seed)
    weights = mx.load(str(src / "model.safetensors"))
    noisy = {k: v + noise * v.abs().mean() * mx.random.normal(v.shape) if v.ndim > 1 else v for k, v in weights.items()}
    mx.save_safetensors(str(dst / "model.safetensors"), noisy)
    return dst


@pytest.fixture(scope="module")
def pair(tiny_models, tmp_path_factory):
    """The tiny target, its tokenizer, a near copy as the draft model (its full head: a random model's output is
    mostly outside a head's subset), a recording of PROMPTS with them and the draft model."""
    root = tmp_path_factory.mktemp("replay")
    draft_folder = _near(tiny_models["qwen2"], root / "draft", 0.01)  # agrees on about 70 % of the tokens
    target, tok = load_model(str(tiny_models["qwen2"]))[:2]
    loaded = {str(draft_folder): load_model(str(draft_folder))[:2]}
    fresh = {"model": lambda: make_drafter(str(draft_folder), target, tok, loaded=loaded, subset_head=False)}
    rec = Recording(str(tiny_models["qwen2"]), TOKENS, "test", {"model": str(draft_folder)})
    record(PROMPTS, target, tok, fresh, TOKENS, root / "rec.json.gz", rec)
    return target, tok, fresh, root / "rec.json.gz", loaded[str(draft_folder)][0]


def _engine_rounds(target, tok, drafter, ids, **kw):
    stats = Stats(trace=[])
    out = [
        s.token
        for s in speculative_generate_step(
            ids, target, drafter, max_tokens=TOKENS, stats=stats, eos_token_ids=tuple(tok.eos_token_ids), **kw
        )
    ]
    return out, stats


@pytest.mark.parametrize("k", [2, 5])
def test_a_recorded_accepted_length_is_what_the_engine_accepts(pair, k):
    """The engine drafting with the model at a fixed K, and the replay of the recording at that K: the same
    continuation, and round by round the same proposed and accepted counts."""
    target, tok, fresh, path, _ = pair
    rec = load(path)
    assert [r.id for r in rec.prompts] == ["edit/a", "question/b", "chat/c"]  # one kind after another
    partial = 0
    for r in rec.prompts:
        out, stats = _engine_rounds(target, tok, fresh["model"](), r.prompt, num_draft=k, adaptive=False)
        assert out == r.target
        engine = [(e["proposed"], e["accepted"]) for e in stats.trace]
        run = replay.replay_one(
            r,
            machines.load("h100"),
            replay.policies([f"fixed:model:{k}"])[0]
            if k in replay.FIXED_K["model"]
            else replay.Policy(f"fixed:model:{k}", ("model",), k, False),
            budget=TOKENS,
        )
        assert [(n, a) for _, n, a, _ in run.trace] == engine
        partial += sum(0 < a < n for n, a in engine)
    assert partial  # the draft agrees on some tokens and not on others: the runs' ends are tested


DRAFT_TICKS = 0.25  # a draft model's pass, in the clock's ticks: drafting pays where most of a draft is accepted


def _cheaper_draft(draft_model, pass_clock, monkeypatch) -> None:
    """The pass-counting clock with the draft model's passes at DRAFT_TICKS of a tick."""
    from mlx_lm.models import qwen2

    counted = qwen2.Qwen2Model.__call__

    def cheaper(self, *args, **kwargs):
        if self is draft_model.model:
            pass_clock.t -= (1 - DRAFT_TICKS) * pass_clock.tick
        return counted(self, *args, **kwargs)

    monkeypatch.setattr(qwen2.Qwen2Model, "__call__", cheaper)


def _clock_profile(tick: float) -> machines.Profile:
    """The pass-counting clock as a machine: every target pass, whatever its size, a tick; a draft pass a quarter of
    one, a catch-up riding in it."""
    draft = DRAFT_TICKS * tick
    return machines.Profile("clock", "PassClock", "tests/conftest.py", tick, {2: tick, 32: tick}, {"model": draft})


@pytest.mark.parametrize("draft", ["model", "hybrid"])
def test_a_replay_predicts_the_engines_time_under_the_pass_clock(pair, pass_clock, monkeypatch, draft):
    """The planner choosing, the engine timed by the pass-counting clock (the draft model's passes a quarter of a
    tick) and the replay under that clock's profile: within 1 % of each other on every prompt, where both drafted
    with the model, round by round the same drafts. The broken versions it catches: a queued plain step not priced,
    a draft step too few, a planner told other seconds than the rounds took, another order of the lookups."""
    target, tok, fresh, path, draft_model = pair
    _cheaper_draft(draft_model, pass_clock, monkeypatch)
    rec, drafted = load(path), 0
    for r in rec.prompts:
        drafter = fresh["model"]()
        if draft == "hybrid":
            from mlx_spec.gen.drafters.hybrid import HybridDrafter

            drafter = HybridDrafter(list(make_drafter("hybrid:none", target, tok).parts), drafter)
        _, stats = _engine_rounds(target, tok, drafter, r.prompt)
        measured = sum(e["seconds"] for e in stats.trace)
        policy = replay.policies([f"planner:{draft}"])[0]
        run = replay.replay_one(r, _clock_profile(pass_clock.tick), policy, budget=TOKENS)
        assert run.tokens == len(r.target)
        assert [(s, n, a) for s, n, a, _ in run.trace] == [
            (e["source"], e["proposed"], e["accepted"]) for e in stats.trace
        ]
        assert run.seconds == pytest.approx(measured, rel=0.01)
        drafted += sum(e["source"] == "model" and e["proposed"] > 1 for e in stats.trace)
    assert drafted >= 3


def test_a_recording_keeps_its_generating_run_and_check_compares_it_with_the_replay(pair, pass_clock, tmp_path):
    """Recorded through the hybrid under the pass-counting clock: `check` under the clock's profile finds the replay
    of each generating run within 1 % of its measured rounds."""
    from mlx_spec.gen.drafters.hybrid import HybridDrafter

    target, tok, fresh, _, _ = pair
    lookups = list(make_drafter("hybrid:none", target, tok).parts)
    rec = Recording("t", TOKENS, "test", {"model": "d"})
    record(
        PROMPTS[:2], target, tok, fresh, TOKENS, tmp_path / "r.json.gz", rec, HybridDrafter(lookups, fresh["model"]())
    )
    assert all(r.measured["drafter"] == "hybrid" and r.measured["rounds"] for r in load(tmp_path / "r.json.gz").prompts)
    tick, clock = pass_clock.tick, tmp_path / "clock.toml"  # every pass a tick, the draft model's too
    clock.write_text(
        machines.to_toml(machines.Profile("clock", "PassClock", "conftest", tick, {2: tick}, {"model": tick}))
    )
    text = replay.check(str(tmp_path / "r.json.gz"), str(clock))
    assert "Mean absolute error 0.0 % over 2 prompts" in text, text


def test_a_recording_resumes_where_it_stopped(pair, tmp_path):
    """A recording cut short after one prompt, resumed: the prompts done are kept as they were, only the rest run."""
    target, tok, fresh, _, _ = pair
    made = []

    def counted():
        made.append(1)
        return fresh["model"]()

    out = tmp_path / "r.json.gz"
    record(PROMPTS[:1], target, tok, {"model": counted}, 8, out, Recording("t", 8, "test"))
    first = load(out).prompts[0]
    record(PROMPTS, target, tok, {"model": counted}, 8, out, load(out))
    again = load(out)
    assert len(made) == 3 and [r.id for r in again.prompts] == ["edit/a", "question/b", "chat/c"]
    assert again.prompts[0] == first


def test_the_replay_table_is_the_same_on_every_run(pair, tmp_path):
    """Under a noisy profile, seeded: the same table twice; another seed moves the noisy timings."""
    _, _, _, path, _ = pair
    noisy = tmp_path / "noisy.toml"
    noisy.write_text(
        machines.load("h100").__class__.__name__
        and (machines.PROFILES_DIR / "h100.toml")
        .read_text()
        .replace("noise = 0.0", "noise = 0.2")
        .replace('name = "h100"', 'name = "noisy"')
    )
    policies = ["plain", "planner:hybrid", "fixed:suffix:8", "onoff:model:3"]
    first = replay.report(str(path), [str(noisy)], policies, seed=1)
    assert first == replay.report(str(path), [str(noisy)], policies, seed=1)
    assert first != replay.report(str(path), [str(noisy)], policies, seed=2)
    assert "### noisy" in first and "hybrid / best member" in first and "oracle:hybrid" in first


def test_the_oracle_is_at_least_every_policy(pair):
    """Knowing the future, no policy yields more tokens a second than the per-round oracle."""
    _, _, _, path, _ = pair
    rec = load(path)
    results = replay.replay(rec, [machines.load("apple-m")], replay.policies())["apple-m"]
    for r in rec.prompts:
        best = results["oracle:hybrid"][r.id]
        for name, runs in results.items():
            assert runs[r.id].tokens / runs[r.id].seconds <= 1.0001 * best.tokens / best.seconds, name


def test_every_profile_loads_and_prices_every_size():
    for name in machines.names():
        p = machines.load(name)
        costs = [p.pass_cost(s) for s in range(1, 40)]
        assert p.source and p.machine and all(c > 0 for c in costs) and p.draft["model"] > 0
        assert costs[0] == p.step


def test_a_bad_profile_or_corpus_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('machine = "m"\nsource = "s"\nstep = 0.01\n[verify]\n2 = -1\n')
    for call in (lambda: machines.load(str(bad)), lambda: machines.load("nope"), lambda: corpus("nope")):
        with pytest.raises(MlxSpecError) as e:
            call()
        assert "\n" not in str(e.value)


def test_the_replay_corpus_holds_five_kinds_of_at_least_twelve():
    prompts = corpus("replay")
    kinds = {p.kind for p in prompts}
    assert len(prompts) >= 60 and len(kinds) >= 5
    assert all(sum(p.kind == k for p in prompts) >= 12 for k in kinds)
    assert all(json.dumps(t) for p in prompts for t in p.tools)


def test_recorded_guesses_are_the_drafters_own_first_tokens_with_a_subset_head(pair):
    """With the vocabulary subset a draft model drafts from (base ids, the prompt, the output so far): the greedy
    guess recorded at every position is the first token the drafter itself proposes there."""
    from mlx_spec.bench.recorded import guesses

    target, tok, _, path, draft_model = pair
    r = load(path).prompts[0]
    make = lambda: make_drafter("model", target, tok, loaded={"model": (draft_model, tok)})  # noqa: E731
    assert make().subset
    recorded = guesses(make(), r.prompt, r.target)
    for i in range(0, len(r.target), 3):
        d = make()
        d.reset(r.prompt)
        assert d.propose(r.prompt + r.target[:i], 1).tokens.tolist() == [recorded[i][0]], i


def test_the_planner_is_told_the_tokens_allowed_not_where_the_recorded_run_ended(pair, monkeypatch):
    """A recorded continuation cut short by EOS: the replay's planner sees the run's budget left (as the engine's
    does, which cannot know where EOS comes), and no round accepts past the recorded end."""
    from dataclasses import replace

    from mlx_spec.gen.planner import Planner

    rec = replace(load(pair[3]).prompts[0])
    rec.target = rec.target[:9]  # as if the target had ended here
    seen: list[int] = []
    real = Planner.plan

    def spy(self, asks, *args, **kwargs):
        seen.append(asks[0].left)
        return real(self, asks, *args, **kwargs)

    monkeypatch.setattr(Planner, "plan", spy)
    run = replay.replay_one(rec, machines.load("h100"), replay.policies(["planner:hybrid"])[0], budget=TOKENS)
    assert run.tokens == 9 and seen[0] == TOKENS
    made = [0]
    for _, _, a, _ in run.trace:
        made.append(made[-1] + a + 1)
    assert all(left == TOKENS - m for left, m in zip(seen, made))


def test_a_session_replay_keeps_one_planner_a_policy_across_the_prompts(pair, monkeypatch):
    """`--session`: one planner a profile and policy serves every prompt in turn, as a server's does; without it, a
    new one a prompt."""
    made: list[object] = []
    real = replay.Policy.planner

    def counted(self):
        made.append(planner := real(self))
        return planner

    monkeypatch.setattr(replay.Policy, "planner", counted)
    rec, chosen = load(pair[3]), replay.policies(["planner:hybrid", "planner:model"])
    replay.replay(rec, [machines.load("h100")], chosen, session=True)
    assert len(made) == len(chosen)
    made.clear()
    replay.replay(rec, [machines.load("h100")], chosen)
    assert len(made) == len(chosen) * len(rec.prompts)


def test_a_measured_profile_is_what_the_engine_s_rounds_cost(tiny_models, tmp_path, pass_clock, monkeypatch):
    """`bench profile` under the pass-counting clock, the draft model's passes a quarter of a tick: a plain step and
    a pass of every verify size cost a tick, a draft step a quarter of one, as the engine's rounds ran them."""
    draft_folder = _near(tiny_models["qwen2"], tmp_path / "draft", 0.01)
    draft_model = load_model(str(draft_folder))[0]
    _cheaper_draft(draft_model, pass_clock, monkeypatch)
    real_load = load_model
    monkeypatch.setattr(
        "mlx_spec.named.load_model",
        lambda spec, *a, **k: (draft_model, *real_load(spec)[1:]) if spec == str(draft_folder) else real_load(spec),
    )
    p = machines.measure(str(tiny_models["qwen2"]), str(draft_folder), "clock")
    tick = pass_clock.tick
    assert p.step == pytest.approx(tick)
    assert p.verify == pytest.approx({s: tick for s in machines.SIZES})
    assert p.draft["model"] == pytest.approx(DRAFT_TICKS * tick)
    assert machines.load(str(_written(tmp_path / "clock.toml", machines.to_toml(p)))).verify == pytest.approx(p.verify)


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
