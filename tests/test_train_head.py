"""`train-head`: a head trained in MLX from the target's states drafts better than where it started, is saved in the
published layout (`eagle3:` and mlx-vlm load it), keeps the output plain decoding's, resumes, and refuses bad input in
one line before writing anything."""

import json

import mlx.core as mx
import pytest
from conftest import CORPUS, close, one_line_error, plain_greedy, run_cli, run_main, spec

from mlx_spec.errors import SourceError
from mlx_spec.gen import registry
from mlx_spec.models import eagle3
from mlx_spec.train import data as td
from mlx_spec.train.data import Shards
from mlx_spec.train.head import HELD, TrainingPlan, chain_acceptance, draft_vocab, initial_head, train

READS = [1, 2, 3]


def trained_for(steps: int, tiny_target, tmp_path_factory):
    """A head trained for `steps` steps (no clock) on the tiny target, with its data, and the head it started from."""
    target, tok = tiny_target
    out = tmp_path_factory.mktemp("head") / "h"
    seqs = td.sequences(tok, CORPUS * 10, 48)  # 120 steps: 31 shards, the first held out, each other seen about once
    plan = TrainingPlan("tiny", READS, 96, 48, minutes=None, lr=3e-3, warmup=1, max_steps=steps)
    train(target, plan, out, seqs)
    shards = Shards(out / "data")
    ids = draft_vocab(shards, 96, target.args.vocab_size)
    return out, initial_head(target, READS, ids), ids


@pytest.fixture(scope="module")
def trained(tiny_target, tmp_path_factory):
    """A head that learned something: 120 steps (a long run: the tests that need one are `slow`)."""
    return trained_for(120, tiny_target, tmp_path_factory)


@pytest.fixture(scope="module")
def brief(tiny_target, tmp_path_factory):
    """A head trained for a few steps: saved, loadable and resumable as a long run's is."""
    return trained_for(4, tiny_target, tmp_path_factory)


@pytest.mark.slow
def test_the_trained_head_drafts_what_the_target_says_far_more_often_than_where_it_started(trained, tiny_target):
    """On text it trained on (a random target's next tokens are a function 120 steps on 2k tokens cannot generalise; a
    real target's can: `bench run head` measures that), the first draft token agrees with the target 3x as often;
    the record holds the held-out curve."""
    target, _ = tiny_target
    out, start, ids = trained
    record = json.loads((out / "train.json").read_text())
    assert record["done"]["steps"] > 10 and record["done"]["tokens"] > 0
    t2d = mx.full((target.args.vocab_size,), -1, dtype=mx.int32).at[ids].add(mx.arange(ids.size, dtype=mx.int32) + 1)
    shards = Shards(out / "data")
    seen, held = next(shards.batches([1])), shards.held_out(record["held"])
    assert record["held"] == HELD  # a shard's worth of sequences, of 248
    head = registry.build(f"eagle3:{out}", *tiny_target).model
    before, after = chain_acceptance(start, seen, t2d), chain_acceptance(head, seen, t2d)
    assert after[0] > 3 * before[0] + 0.05, (before, after)
    assert record["done"]["curve"][-1]["acceptance"] == [round(a, 4) for a in chain_acceptance(head, held, t2d)]


def test_the_saved_head_is_the_published_layout_that_mlx_vlm_loads(brief, tiny_target):
    from mlx_vlm.speculative.drafters.eagle3 import Eagle3DraftModel
    from mlx_vlm.speculative.drafters.eagle3 import ModelConfig as Eagle3Config

    target, _ = tiny_target
    out = brief[0]
    assert json.loads((out / "config.json").read_text())["transformer_layer_config"]["hidden_act"] == "silu"
    ref = Eagle3DraftModel(Eagle3Config.from_dict(json.loads((out / "config.json").read_text())))
    weights = ref.sanitize(mx.load(str(out / eagle3.FILE)))
    weights["embed_tokens.weight"] = target.model.embed_tokens.weight  # the head reads the target's embedding
    ref.load_weights(list(weights.items()), strict=True)
    mine = eagle3.load(out, embed=target.model.embed_tokens)
    mx.random.seed(3)
    tokens = mx.random.randint(0, target.args.vocab_size, (1, 7))
    states = mx.random.normal((1, 7, 3 * target.args.hidden_size))
    ref.reset(None)
    assert close(mine.logits(mine(tokens, states)), ref._logits(ref._forward_tokens(tokens, states, mx.int32)))


def test_drafting_with_the_trained_head_keeps_plain_decodings_output(brief, tiny_target):
    target, tok = tiny_target
    drafter = registry.build(f"eagle3:{brief[0]}", target, tok)
    for text in ("def add(a, b):\n", "class Point:\n"):
        prompt = tok.encode(text)
        toks, stats = spec(target, prompt, drafter, max_tokens=24, num_draft=3, adaptive=False)
        assert toks == plain_greedy(target, prompt, 24) and stats.proposed > 0


def test_resume_goes_on_from_the_checkpoint(brief, tiny_target, tmp_path):
    import shutil

    target, tok = tiny_target
    out = tmp_path / "h"
    shutil.copytree(brief[0], out)
    record = json.loads((out / "train.json").read_text())
    before = record["done"]["steps"]
    train(
        target,
        TrainingPlan("tiny", READS, 96, 48, minutes=None, max_steps=before + 5),
        out,
        td.sequences(tok, CORPUS * 10, 48),
        resume=True,
    )
    again = json.loads((out / "train.json").read_text())
    assert again["done"]["steps"] == before + 5 and again["held"] == record["held"]  # the same sequences held out
    assert json.loads((out / "config.json").read_text())["transformer_layer_config"]["hidden_act"] == "silu"


@pytest.mark.parametrize("n,held", [(2, 1), (1, 0)])
def test_a_text_of_a_sequence_or_two_trains_a_head_holding_out_what_it_can_spare(tiny_target, tmp_path, n, held):
    """Little text is trained on: of two sequences one is held out, of one none (its curve is then measured on it)."""
    target, tok = tiny_target
    seqs, said = td.sequences(tok, CORPUS * 10, 48)[:n], []
    train(target, TrainingPlan("tiny", READS, 96, 48, minutes=None, max_steps=3), tmp_path / "h", seqs, log=said.append)
    record = json.loads((tmp_path / "h" / "train.json").read_text())
    assert record["held"] == held and record["done"]["steps"] == 3 and (tmp_path / "h" / eagle3.FILE).is_file()
    assert any("none is held out" in line for line in said) == (held == 0)


def test_a_run_out_of_time_before_its_features_still_trains_on_the_first_shard(tiny_target, tmp_path):
    """A budget spent before the target's features start (a slow load, a busy machine) still computes one shard and
    trains one step on it: the run yields a head, whatever the machine's speed."""
    target, tok = tiny_target
    seqs = td.sequences(tok, CORPUS * 10, 48)
    train(target, TrainingPlan("tiny", READS, 96, 48, minutes=1e-9), tmp_path / "h", seqs)
    record = json.loads((tmp_path / "h" / "train.json").read_text())
    assert Shards(tmp_path / "h" / "data").count() == 8 and record["done"]["steps"] == 1  # one shard, one step


def test_a_text_too_short_for_one_sequence_is_refused_saying_how_many_more_tokens_it_needs(tiny_target):
    _, tok = tiny_target
    have = len(tok.encode(CORPUS[0])) + 1  # and the EOS after it
    with pytest.raises(SourceError, match=rf"holds {have} tokens: {48 - have} more make one sequence of 48"):
        td.sequences(tok, CORPUS[:1], 48)


@pytest.mark.slow
def test_bad_input_is_one_line_refused_and_writes_nothing(tiny_models, tmp_path):
    (tmp_path / "empty.txt").write_text("")
    cases = [
        ("--target", str(tmp_path / "nowhere")),
        ("--data", str(tmp_path / "empty.txt")),
        ("--data", str(tmp_path / "missing.txt")),
        ("--regenerate", str(tmp_path / "missing.txt")),
    ]
    for flag, value in cases:
        args = ["train-head", "--out", str(tmp_path / "out"), "--budget-minutes", "0.1"]
        args += [flag, value] if flag == "--target" else ["--target", str(tiny_models["qwen2"]), flag, value]
        assert one_line_error(run_main(*args))
        assert not (tmp_path / "out").exists()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")  # a head already there: refused before any reply is made
    r = run_main(
        "train-head",
        "--out",
        str(tmp_path / "out"),
        "--target",
        str(tiny_models["qwen2"]),
        "--regenerate",
        "default",
        "--budget-minutes",
        "0.1",
    )
    assert one_line_error(r) and "not empty" in r.stderr and "replies" not in r.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["config.json"]


@pytest.mark.slow
def test_bench_run_head_measures_the_head_with_its_training_record_and_learning_curve(trained, tiny_models, tmp_path):
    """`bench run SUITE --head DIR` for a suite naming HEAD: the head's rows (alone and in the hybrid) equal the
    target alone, per set their tau and acceptance by position, and the training record and curve beside them; a
    suite naming HEAD without --head, or --head for one that does not, is one line."""
    out = trained[0]
    suite = tmp_path / "h.toml"
    suite.write_text(
        'description = "head"\nkind = "table"\nmax_tokens = 8\nrepeats = 1\n'
        'prompts = { humaneval = 1, prose = 1 }\n\n[[targets]]\nmodel = "qwen2.5-coder-0.5b"\n'
        'drafts = ["eagle3:HEAD", "hybrid:eagle3:HEAD"]\n'
    )
    r = run_cli(
        "bench",
        "run",
        str(suite),
        "--out",
        str(tmp_path / "runs"),
        "--head",
        str(out),
        "--model",
        str(tiny_models["qwen2"]),
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(next((tmp_path / "runs").glob("h-*.json")).read_text())
    assert data["training"]["done"]["steps"] > 10 and data["training"]["folder"] == str(out)
    rows = {e["draft"]: e for e in data["summary"]}
    assert rows[f"eagle3:{out}"]["identical"] == rows[f"hybrid:eagle3:{out}"]["identical"] == 2
    md = next((tmp_path / "runs").glob("h-*.md")).read_text()
    assert "Learning curve" in md and "| τ" in md.replace("τ (held out)", "")
    curve = [x.split("|")[2].strip() for x in md.split("Learning curve")[1].splitlines() if x.startswith("| ")]
    assert curve[1:] == [str(p["steps"]) for p in data["training"]["done"]["curve"]]  # a line a checkpoint
    for args, words in (([], "give its folder with --head"), (["--head", str(out), "--model", "x"], None)):
        if words is None:
            plain = tmp_path / "p.toml"
            plain.write_text(suite.read_text().replace('"eagle3:HEAD", "hybrid:eagle3:HEAD"', '"ngram"'))
            r = run_main("bench", "run", plain, "--out", tmp_path / "runs2", *args)
            words = "--head is for a suite"
        else:
            r = run_main("bench", "run", suite, "--out", tmp_path / "runs2", *args)
        assert r.returncode != 0 and words in one_line_error(r)


@pytest.mark.slow  # parses the whole standard library
def test_the_default_asks_are_open_questions_and_functions_to_complete_none_a_benchmark_prompt(tiny_target):
    from mlx_spec.bench.prompts import PROSE_QUESTIONS, build

    asks = td.default_asks()
    held = [p.text for p in build(tiny_target[1], 164, 0, n_prose=len(PROSE_QUESTIONS))]
    assert not set(asks) & set(held)
    code = [a for a in asks if a.startswith("Complete the following Python function")]
    assert len(code) == len(asks) // 2 and all(a.count("```") == 3 and "\ndef " in a for a in code)


def test_the_replies_are_the_targets_own_greedy_continuations(tiny_target):
    target, tok = tiny_target
    asks = ["def add(a, b):", "The quick brown fox", "import numpy as np\nx = np.zeros((3, 4))\n"]
    got = td.replies(target, tok, asks, 12, batch=2)
    for ask, seq in zip(asks, got):
        prompt = list(tok.apply_chat_template([{"role": "user", "content": ask}], add_generation_prompt=True))
        plain = plain_greedy(target, prompt, 12, eos=set(tok.eos_token_ids))
        assert seq == prompt + [t for t in plain if t not in tok.eos_token_ids]  # the stop token is not kept


def test_the_replies_are_made_once_and_a_restart_trains_on_the_same_sequences(tiny_target, tmp_path, monkeypatch):
    from mlx_spec.train import job

    target, tok = tiny_target
    (tmp_path / "asks.txt").write_text("def add(a, b):\nThe quick brown fox\n")
    (tmp_path / "text.txt").write_text("".join(CORPUS))
    seen = []
    monkeypatch.setattr(job, "train", lambda model, plan, out, seqs, **kw: seen.append((plan, seqs)) or out)
    kw = dict(
        held=[],
        data=[str(tmp_path / "text.txt")],
        regenerate=tmp_path / "asks.txt",
        reply_tokens=6,
        minutes=1,
        draft_vocab=64,
        length=16,
    )
    job.run(target, tok, "tiny", tmp_path / "h", **kw)
    monkeypatch.setattr(td, "replies", lambda *a, **k: pytest.fail("the replies were made again"))
    job.run(target, tok, "tiny", tmp_path / "h", **kw)  # stopped before its first checkpoint: started again
    (first_plan, first), (_, again) = seen
    assert first == again and first_plan.data_share == 0.5
    replies = json.loads((tmp_path / "h" / "data" / job.REPLIES).read_text())
    stream = [t for r in replies for t in r + [min(tok.eos_token_ids)]]
    chunks = [stream[i : i + 16] for i in range(0, len(stream) - 15, 16)]
    assert len(replies) == 2 and chunks and sorted(first[: len(chunks)]) == sorted(chunks)  # the replies first
