"""The chat's parts without a terminal: the stats line, the /compare table, slash commands, cache reuse, /save."""

import json

import mlx.nn as nn
import pytest

from mlx_spec import named
from mlx_spec.chat import commands, pair, report
from mlx_spec.chat.conversation import Chat, Settings
from mlx_spec.gen.session import Session
from mlx_spec.gen.stats import Stats
from mlx_spec.named import load_pair


def spec_stats() -> Stats:
    # 101 tokens in 2 s (100 after the first), 40 of 50 drafts accepted over 20 speculative rounds.
    return Stats(
        generation_tokens=101,
        generation_time=2.0,
        first_tokens=1,  # the first round's, timed with the prompt
        proposed=50,
        accepted=40,
        from_draft=40,
        spec_rounds=20,
        rounds=61,
        proposed_by_position=[20, 20, 10],
        accepted_by_position=[18, 15, 7],
        wait_time=1.5,
    )


def test_stats_line_has_speed_drafts_acceptance_and_an_estimated_speedup():
    line = report.stats_line(spec_stats(), plain_step_s=0.04, drafting=True)
    assert line == (
        "[50.0 tok/s · 40% of tokens from drafts · acceptance 80% · mean accepted 2.00 · "
        "2.00x vs plain ~25.0 tok/s (est. from measured target steps)]"
    )
    assert report.stats_line(Stats(generation_tokens=11, generation_time=1.0, first_tokens=1), 0.1, drafting=True) == (
        "[10.0 tok/s · 0% of tokens from drafts · no draft tokens proposed · 1.00x vs plain ~10.0 tok/s "
        "(est. from measured target steps)]"
    )
    assert report.stats_line(spec_stats(), None, drafting=False) == "[50.0 tok/s · plain decoding (drafter off)]"


def test_stats_detail_lists_each_position_and_the_times():
    text = report.stats_detail(spec_stats())
    assert "1: 18/20 (90%)  2: 15/20 (75%)  3: 7/10 (70%)" in text
    assert "generation 2.000 s (waiting on the device 1.500 s)" in text


def test_compare_table_is_the_m3_max_layout_plain_row_first():
    table = report.compare_table(
        report.CompareRow("qwen2.5-coder-1.5b float32", "N/A", "N/A", 20.0),
        report.CompareRow("qwen2.5-coder-1.5b float32", "hybrid:qwen2.5-coder-0.5b", "int4", 29.0),
    )
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()]
    assert rows[0] == ["Target", "Draft", "Quantization", "Token/s", "Relative Improvement"]
    assert set("".join(rows[1])) == {"-"}
    assert rows[2] == ["qwen2.5-coder-1.5b float32", "N/A", "N/A", "20.00", "0%"]
    assert rows[3] == ["qwen2.5-coder-1.5b float32", "hybrid:qwen2.5-coder-0.5b", "int4", "29.00", "+45.00%"]
    assert len({len(line) for line in table.splitlines()}) == 1  # aligned columns


def test_identity_line():
    assert "token-identical (3 tokens)" in report.identity_line([1, 2, 3], [1, 2, 3], greedy=True)
    assert "DIFFER from token 1" in report.identity_line([1, 5, 3], [1, 2, 3], greedy=True)
    assert "DIFFER from token 2" in report.identity_line([1, 2], [1, 2, 3], greedy=True)
    assert "only greedy replies must be token-identical" in report.identity_line([1], [2], greedy=False)


def test_quantization_and_names():
    class Tiny(nn.Module):
        def __init__(self, q: bool):
            super().__init__()
            self.proj = nn.QuantizedLinear(64, 64, bits=4, group_size=32) if q else nn.Linear(64, 64)

    assert named.quantization(Tiny(True)) == "int4"
    assert named.quantization(Tiny(False)) == "float32"
    assert named.quantization(None) == "N/A"
    assert named.table_name("none") == "N/A"
    assert named.table_name("hybrid:qwen2.5-coder-0.5b") == "hybrid:qwen2.5-coder-0.5b"


def test_short_name_of_folders(tiny_models):
    assert named.table_name(str(tiny_models["qwen2_draft"])) == "qwen2_draft"
    assert named.table_name(f"hybrid:{tiny_models['qwen2_draft']}") == "hybrid:qwen2_draft"


def test_pair_that_works_names_the_qwen_pair_once_it_is_on_disk(tmp_path):
    from mlx_spec.make.resolve import recipe_path

    assert "--draft ngram" in pair.pair_that_works(str(tmp_path))  # a folder target: n-gram drafting needs nothing
    for name in pair.LOCAL_PAIR:
        recipe_path(name).mkdir(parents=True)
        (recipe_path(name) / "config.json").write_text("{}")
    assert pair.pair_that_works(str(tmp_path)) == (
        "a local pair that works: --model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b"
    )


@pytest.fixture
def chat(tiny_models):
    model, draft = str(tiny_models["qwen2"]), str(tiny_models["qwen2_draft"])
    target, tok, drafter = load_pair(model, draft)
    loader = pair.DraftLoader(target, tok, log=lambda m: None)
    return Chat(Session(target, tok, drafter), model, draft, Settings(max_tokens=24), loader, system="Be brief.")


def run(chat, line):
    out = []
    commands.dispatch(chat, line, out.append)
    return "\n".join(out)


def test_later_turns_reuse_the_cache_even_after_an_interrupted_reply(chat):
    gen = chat.ask("def add(a, b):")
    for _ in range(5):
        next(gen)
    gen.close()  # what Ctrl-C does: the partial reply stays
    first = chat.last
    assert first.interrupted and len(first.tokens) == 5 and chat.messages[-1]["role"] == "assistant"
    list(chat.ask("and sub?"))
    second = chat.last
    # Everything the model saw (its own 5 tokens included) is cached, except the last token, fed next.
    assert second.stats.prompt_cached == len(first.prompt_ids) + 5 - 1
    list(chat.ask("and mul?"))
    assert chat.last.stats.prompt_cached == len(second.prompt_ids) + len(second.tokens) - 1


def test_compare_regenerates_the_last_reply_plainly_and_keeps_the_drafter(chat):
    assert "no reply to compare yet" in run(chat, "/compare")
    list(chat.ask("def add(a, b):"))
    drafter = chat.session.drafter
    out = run(chat, "/compare")
    assert "Relative Improvement" in out and "greedy: the two replies are token-identical" in out
    assert chat.session.drafter is drafter and len(chat.replies) == 1


def test_bad_settings_print_one_line_and_change_nothing(chat):
    assert run(chat, "/temp -1") == "error: --temp must be >= 0, got -1.0"
    assert run(chat, "/temp hot") == "error: /temp needs a number, got 'hot'"
    assert run(chat, "/top-p 1.5") == "error: --top-p must be in [0, 1], got 1.5"
    assert run(chat, "/k 0") == "error: /k must be >= 1, got 0"
    assert run(chat, "/draft no-such-model").startswith("error: unknown model 'no-such-model'")
    assert (chat.settings.temp, chat.settings.top_p, chat.draft_name) == (0.0, 0.0, chat.draft_name)
    assert chat.drafting
    assert run(chat, "/nope").startswith("unknown command /nope")
    run(chat, "/temp 0.7")
    run(chat, "/k 3")
    assert chat.settings.temp == 0.7 and chat.session.num_draft == 3


def test_draft_off_on_and_switch_keep_the_conversation(chat):
    list(chat.ask("def add(a, b):"))
    drafter = chat.session.drafter
    run(chat, "/draft off")
    assert chat.session.drafter is None and chat.draft_name == "none"
    list(chat.ask("more"))
    assert chat.last.draft == "none" and chat.last.stats.prompt_cached > 0
    assert "plain decoding already" in run(chat, "/compare")
    run(chat, "/draft on")
    assert chat.session.drafter is drafter
    run(chat, "/draft ngram")
    assert chat.draft_name == "ngram" and chat.draft_quantization == "N/A" and len(chat.replies) == 2
    run(chat, "/reset")
    assert chat.replies == [] and [m["role"] for m in chat.messages] == ["system"]


def test_save_writes_the_transcript_with_stats_atomically(chat, tmp_path):
    list(chat.ask("def add(a, b):"))
    out = tmp_path / "chat.json"
    assert "saved 3 messages" in run(chat, f"/save {out}")
    data = json.loads(out.read_text())
    assert [m["role"] for m in data["messages"]] == ["system", "user", "assistant"]
    reply = data["messages"][2]
    assert reply["tokens"] == len(chat.last.tokens) and "acceptance_by_position" in reply["stats"]
    assert [p.name for p in tmp_path.iterdir()] == ["chat.json"]  # no temp file left behind
    assert run(chat, "/save").startswith("error: /save needs a file name")


def test_model_text_cannot_drive_the_terminal(capsys):
    from mlx_spec.chat.repl import _show
    from mlx_spec.gen.stream import Event

    _show(Event(0, "a\x1b[2J\rb\n\tc\x9b", False, Stats()))
    assert capsys.readouterr().out == "a\ufffd[2J\ufffdb\n\tc\ufffd"
