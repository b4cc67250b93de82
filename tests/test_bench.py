"""Bench helpers: mlx-lm's acceptance rebuilt from its from_draft flags, and the prompt sets."""

from mlx_spec.bench.common import first_mismatch, rounds_from_flags
from mlx_spec.bench.prompts import PROSE_QUESTIONS, build

T, F = True, False


def test_rounds_from_flags_rebuilds_each_round():
    # k=3: [T T F] two accepted + correction; [F] none accepted; [T T T F] all three + bonus.
    r = rounds_from_flags([T, T, F, F, T, T, T, F], k=3, max_tokens=100)
    assert (r["rounds"], r["proposed"], r["accepted"]) == (3, 9, 5)
    assert r["proposed_by_position"] == [3, 3, 3] and r["accepted_by_position"] == [2, 2, 1]
    assert r["mean_accepted"] == 5 / 3 and r["draft_share"] == 5 / 8


def test_rounds_from_flags_near_max_tokens_and_at_eos():
    # max_tokens=4, k=3: round 1 proposes 3 (T T F: 3 tokens), round 2 may propose only 1 more token.
    r = rounds_from_flags([T, T, F, F], k=3, max_tokens=4)
    assert r["proposed_by_position"] == [2, 1, 1] and r["accepted_by_position"] == [1, 1, 0]
    # A run cut at an EOS inside the drafts: the unseen drafts of that round count as rejected.
    r = rounds_from_flags([T, T], k=3, max_tokens=100)
    assert (r["rounds"], r["proposed"], r["accepted"]) == (1, 3, 2)


def test_first_mismatch():
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 2, 3], [1, 5, 3]) == 1
    assert first_mismatch([1, 2], [1, 2, 3]) == 2


class _Tok:
    chat_template = None

    def encode(self, text):
        return [ord(c) % 50 for c in text[:20]]


def test_prompt_sets_are_interleaved():
    prompts = build(_Tok(), 0, 0, n_prose=3)
    assert [p.set for p in prompts] == ["prose"] * 3 and prompts[0].text == PROSE_QUESTIONS[0]


def test_the_spec_benchmark_runs_every_drafter_kind_on_tiny_models(tiny_models, tmp_path):
    """Each config of `bench spec` (but mlx-lm's and the quantized drafts, which need the real pair) on a tiny
    target: every output token-identical to plain decoding, every ratio computed."""
    import json

    from mlx_spec.bench.spec import SpecSettings, run_spec

    draft = str(tiny_models["qwen2_draft"])
    s = SpecSettings(target=str(tiny_models["qwen2"]), drafts={"f32": draft, "int8": draft, "int4": draft},
                     configs=["plain", "model-f32", "ngram", "suffix", "self", "quant-self", "hybrid"],
                     humaneval=1, edit=0, prose=1, max_tokens=12)  # the edits outgrow the tiny context
    run = run_spec(s, str(tmp_path))
    data = json.loads(run.json_path.read_text())
    assert data["complete"] and not data["errors"]
    configs = {r["config"] for r in data["records"]}
    assert configs == set(s.configs)
    assert all(r["identical"] for r in data["records"] if r["config"] != "plain")
