"""`mlx-spec bench run agent`: agent sessions replayed turn by turn against a server per configuration and
mlx_lm.server, timed by the client, recorded so `bench report` rebuilds the page."""

import contextlib
import itertools
import json
import re
from pathlib import Path

import pytest
from conftest import TOOL_TEMPLATE, long_context, one_line_error, run_main

from mlx_spec.bench import agent, agent_run, agent_sessions
from mlx_spec.bench.agent_sessions import SessionSpec

HEAD = 'kind = "agent"\n[[targets]]\nmodel = "m"\n'
# The end-to-end run's sessions: aider-diff's turns (7,600 tokens of the tiny tokenizer each, 15 s a reply here) are
# built and checked by the tests of the sessions below; served, they are chat messages as aider-whole's are.
SESSIONS = [("aider-whole", "bisect", 2, 30), ("tools", "bisect", 4, 30)]


def tiny_suite(path: Path, target, draft, mlx_lm_server: bool) -> Path:
    lines = [
        'description = "tiny"',
        'kind = "agent"',
        "max_tokens = 8",
        f"mlx_lm_server = {json.dumps(mlx_lm_server)}",
        "prefix_cache_gb = 0.05",
        "",
        "[[targets]]",
        f"model = {json.dumps(str(target))}",
        f"drafts = {json.dumps([f'hybrid:{draft}', str(draft), 'suffix'])}",
    ]
    for fmt, file, turns, n in SESSIONS:
        lines += ["", "[[sessions]]", f'format = "{fmt}"', f'file = "{file}"', f"turns = {turns}", f"lines = {n}"]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def tool_target(tiny_models, tmp_path_factory):
    """The tiny target with Qwen2.5's tool template, cut down, and room for aider's long prompts."""
    from transformers import AutoTokenizer

    dst = long_context(tiny_models["qwen2"], tmp_path_factory.mktemp("agent") / "target", context=32768)
    tok = AutoTokenizer.from_pretrained(str(dst))
    tok.chat_template = TOOL_TEMPLATE
    tok.save_pretrained(str(dst))
    return dst


# ---- the sessions: real formats, each turn carrying the recorded turns before it


def test_aider_sessions_carry_the_recorded_edit_and_the_file_as_it_stands_after_it():
    whole, diff = agent_sessions.build(
        [SessionSpec("aider-whole", "bisect", 2), SessionSpec("aider-diff", "bisect", 2)]
    )
    _path, source = agent_sessions.stdlib_source("bisect")
    first, second = whole
    assert first.messages[0]["role"] == "system" and "*file listing*" in first.messages[0]["content"]
    assert source in first.messages[-3]["content"] and first.messages[-1]["content"].endswith(
        agent_sessions.aider.WHOLE_REMINDER
    )
    edited = second.messages[-3]["content"]  # the file as aider sends it after the first edit
    assert "# insort_right: part of" in edited and source not in edited
    done = second.messages[len(first.messages) - 3 : -3]  # the first request, the recorded reply, "I updated ..."
    assert [m["role"] for m in done] == ["user", "assistant", "user", "assistant"]
    assert done[2]["content"] == "I updated the files."
    block = re.search(r"<<<<<<< SEARCH\n(.*?)\n=======\n(.*?)\n>>>>>>> REPLACE", diff[1].messages[-6]["content"], re.S)
    assert block is not None and block.group(1) in source  # a search/replace block that applies to the file
    assert source.replace(block.group(1), block.group(2), 1) in diff[1].messages[-3]["content"]


def test_a_tool_session_replays_the_recorded_calls_and_their_results_with_shared_schemas():
    ((a,),), ((b,),) = [agent_sessions.build([SessionSpec("tools", m, 1)]) for m in ("bisect", "glob")]
    assert a.tools == b.tools == agent_sessions.TOOLS and a.messages[0] == b.messages[0]  # one system prompt
    turns = agent_sessions.build([SessionSpec("tools", "bisect", 4)])[0]
    read, edit = turns[1].messages[-2:], turns[2].messages[-2:]
    call = read[0]["tool_calls"][0]
    assert call["function"]["name"] == "read_file" and read[1]["tool_call_id"] == call["id"]
    assert read[1]["content"] == agent_sessions.stdlib_source("bisect")[1]
    args = json.loads(edit[0]["tool_calls"][0]["function"]["arguments"])
    assert args["old_string"] in read[1]["content"] and edit[1]["content"].startswith("Edited")
    assert turns[3].messages[-1]["role"] == "user" and "bisect_right" in turns[3].messages[-1]["content"]
    assert [t.index for t in turns] == [0, 1, 2, 3] and all(
        t.messages[: len(turns[0].messages)] == turns[0].messages for t in turns
    )


# ---- long shared prefixes: the same task at ~1k and ~16k tokens of context


def chars(messages: list[dict]) -> int:
    """The characters a prompt's messages carry: their text and their tool calls' arguments."""
    return sum(
        len(m.get("content") or "") + sum(len(c["function"]["arguments"]) for c in m.get("tool_calls", []))
        for m in messages
    )


def padding(turn) -> list[dict]:
    """A turn's padding messages: aider's read-only files and the reply to them, or the read_file calls and their
    results before the first request."""
    if turn.kind == "tools":
        return list(itertools.takewhile(lambda m: m["role"] != "user", turn.messages[1:]))
    i = next(i for i, m in enumerate(turn.messages) if m["content"].startswith(agent_sessions.aider.READ_ONLY_PREFIX))
    return turn.messages[i : i + 2]


@pytest.mark.parametrize(
    "fmt, file, turns", [("aider-whole", "bisect", 2), ("aider-diff", "bisect", 2), ("tools", "bisect", 4)]
)
@pytest.mark.parametrize("context", [1000, 15000])
def test_context_pads_every_turn_s_shared_prefix_with_other_modules_to_about_the_asked_size(fmt, file, turns, context):
    spec = SessionSpec(fmt, file, turns, context=context)
    (padded,), (again,) = agent_sessions.build([spec]), agent_sessions.build([spec])  # two runs
    (plain,) = agent_sessions.build([SessionSpec(fmt, file, turns)])
    assert padded[0].session == f"{fmt}:{file}:ctx{context}" != plain[0].session  # one task, two sessions
    assert json.dumps([t.messages for t in padded]) == json.dumps([t.messages for t in again])  # the same bytes
    pad = padding(padded[0])
    shared = padded[0].messages.index(pad[-1]) + 1  # the system prompt (and aider's examples), then the padding
    assert all(t.messages[:shared] == padded[0].messages[:shared] for t in padded[1:])  # every turn's prefix
    if fmt == "tools":  # what the agent read before the first request: calls answered by their results
        assert padded[0].messages[0]["role"] == "system" and padded[0].messages[len(pad) + 1]["role"] == "user"
        assert [m["role"] for m in pad] == ["assistant", "tool"] * (len(pad) // 2)
        assert all(c["tool_call_id"] == a["tool_calls"][0]["id"] for a, c in zip(pad[::2], pad[1::2]))
    else:  # aider's /read files: after the examples, before the conversation so far
        assert pad[1]["content"] == agent_sessions.aider.READ_ONLY_REPLY
        i = padded[1].messages.index(pad[1])
        assert padded[1].messages[i + 1]["content"].startswith("In lib/bisect.py")  # the first task, done
    for p, q in zip(padded, plain):  # the prompt grows by about `context` tokens of characters, and by nothing else
        assert (
            abs(chars(p.messages) - chars(q.messages) - context * agent_sessions.CHARS_PER_TOKEN) < 0.1 * 3.2 * context
        )
        assert [m for m in p.messages if m not in pad] == q.messages
    _path, source = agent_sessions.stdlib_source("functools")  # the list's first module, from its start
    assert "lib/functools.py" in json.dumps(pad) and source[:2000] in "".join(m["content"] for m in pad)


def test_the_padding_is_other_modules_than_the_session_s_own_and_a_context_too_large_fails_in_one_line():
    (turn,) = agent_sessions.build([SessionSpec("tools", "functools", 1, context=2000)])[0]
    paths = [json.loads(m["tool_calls"][0]["function"]["arguments"])["path"] for m in padding(turn)[::2]]
    assert paths[0] == "lib/contextlib.py" and "lib/functools.py" not in paths  # the list's first, left out
    (aider,) = agent_sessions.build([SessionSpec("aider-whole", "functools", 1, context=2000)])[0]
    assert (
        "lib/functools.py" not in padding(aider)[0]["content"]
        and "\nlib/contextlib.py\n```\n" in padding(aider)[0]["content"]
    )
    with pytest.raises(agent_sessions.MlxSpecError, match="more than the modules that pad it hold") as e:
        agent_sessions.build([SessionSpec("tools", "bisect", 1, context=10**6)])
    assert "\n" not in str(e.value)


MACHINE = {"cpu": "cpu", "machine": "x86_64", "cpu_count": 2, "blas_status": "ok", "mlx": "0", "mlx_device": "cpu"}
MACHINE |= {"mlx_lm": "0", "mlx_spec": "0", "git_rev": "abc", "loadavg_start": [0.0]}


def fake_record() -> dict:
    """A run of two sessions (the same task at 0 and ~15k tokens of context), plain and suffix, three turns each:
    the first uncached, the later two on the cached prefix; suffix decodes twice as fast, the padded session's turns
    start later."""
    sessions = [{"format": "tools", "file": "fnmatch", "turns": 3, "lines": 0, "context": c} for c in (0, 15000)]
    suite = {"name": "agent-long", "description": "d", "kind": "agent", "max_tokens": 128, "mlx_lm_server": False}
    suite |= {"prefix_cache_gb": 1.2, "targets": [{"model": "m", "drafts": ["suffix"]}], "sessions": sessions}
    records = []
    for session, prompt, ttft in (("tools:fnmatch", 400, 0.5), ("tools:fnmatch:ctx15000", 15400, 1.0)):
        for turn in range(3):
            for config, tps in (("none", 10.0), ("suffix", 20.0)):
                records.append(
                    {
                        "config": config,
                        "prompt": f"{session}/{turn}",
                        "session": session,
                        "turn": turn,
                        "set": "tools",
                        "prompt_tokens": prompt + 100 * turn,
                        # the first turn finds only a shared system prompt cached: not a cached turn
                        "cached_tokens": prompt + 100 * turn - 50 if turn else 100,
                        "n_tokens": 20,
                        "ttft": 30.0 if turn == 0 else ttft * turn,  # the uncached first turn: a 30 s prefill
                        "total": 32.0,
                        "decode_tps": tps * (0.9 if "ctx" in session else 1),
                        "identical": None if config == "none" else True,
                        "stats": {},
                    }
                )
    return {
        "suite": suite,
        "command": ["mlx-spec", "bench", "run", "agent-long"],
        "machine": MACHINE,
        "records": records,
        "complete": True,
    }


def test_the_page_compares_each_session_s_cached_turns_and_decode_speed_per_configuration():
    data = fake_record()
    page = agent.render(data)
    suffix = next(e for e in data["summary"] if e["config"] == "suffix")["by_session"]["tools:fnmatch:ctx15000"]
    assert suffix["prompt_tokens_median"] == 15500 and suffix["cached_turns"] == 2
    assert suffix["cached_ttft_median"] == 1.5  # turns 1 and 2 (1.0, 2.0); the first turn's 30 s prefill left out
    assert suffix["decode_tps_median"] == 18.0 and suffix["decode_vs_plain"] == 2.0
    rows = [line.split("|")[1:-1] for line in page.splitlines() if line.startswith("| tools:fnmatch")]
    assert [[c.strip() for c in r] for r in rows] == [
        ["tools:fnmatch", "none", "500", "0.75", "10.00", "-"],
        ["tools:fnmatch", "suffix", "500", "0.75", "20.00", "2.00x"],
        ["tools:fnmatch:ctx15000", "none", "15500", "1.50", "9.00", "-"],
        ["tools:fnmatch:ctx15000", "suffix", "15500", "1.50", "18.00", "2.00x"],
    ]
    assert "~15000 tokens of other modules' source" in page
    assert agent.render(json.loads(json.dumps(data))) == page  # `bench report`: the page from the record alone


def test_the_order_of_configurations_rotates_by_one_each_turn():
    configs = ["none", "suffix", "ngram", "mlx_lm.server"]
    orders = [agent_run.order(configs, t) for t in range(8)]
    assert orders[0] == configs and orders[1] == ["suffix", "ngram", "mlx_lm.server", "none"]
    for c in configs:  # every configuration goes first, and last, once in every len(configs) turns
        assert [o[0] for o in orders[:4]].count(c) == 1 and [o[-1] for o in orders[4:]].count(c) == 1


@pytest.mark.parametrize(
    "text, field",
    [
        (HEAD + 'drafts = ["suffix"]\n', "[[sessions]]"),
        (
            HEAD + 'drafts = ["none"]\n[[sessions]]\nformat = "tools"\nfile = "glob"\n',
            "'drafts'",
        ),
        (
            HEAD + 'drafts = ["suffix"]\n[[sessions]]\nformat = "cline"\nfile = "x"\n',
            "'format'",
        ),
        ('kind = "agent"\nmax_tokns = 3\n', "'max_tokns'"),
        (HEAD + 'drafts = ["suffix"]\n[[sessions]]\nformat = "tools"\nfile = "glob"\ncontext = -1\n', "'context'"),
        (HEAD + 'drafts = ["suffix"]\n[[sessions]]\nformat = "tools"\nfile = "glob"\ncontext = "16k"\n', "'context'"),
    ],
)
def test_an_agent_suite_with_a_mistake_is_one_line_naming_the_file_and_field(tmp_path, text, field):
    path = tmp_path / "mine.toml"
    path.write_text(text)
    with pytest.raises(agent.SuiteError) as e:
        agent.load(str(path))
    assert str(path) in str(e.value) and field in str(e.value) and "\n" not in str(e.value)
    assert agent.is_agent(str(path)) and agent.load("agent").configs[0] == "none"


# ---- the client's clock: TTFT at the first streamed text, not at the first byte nor at the end


class Lines:
    """A streamed response whose every line advances the fake clock by one."""

    def __init__(self, lines, clock):
        self.lines, self.clock, self.status_code = lines, clock, 200

    def iter_lines(self):
        for line in self.lines:
            self.clock[0] += 1
            yield line


def test_ttft_is_the_first_streamed_text_and_decode_speed_the_tokens_between_it_and_the_last(monkeypatch):
    mod = agent_run
    clock = [0.0]
    monkeypatch.setattr(mod.time, "perf_counter", lambda: clock[0])
    chunk = lambda delta, **kw: "data: " + json.dumps({"choices": [{"delta": delta, "finish_reason": None}], **kw})  # noqa: E731
    lines = [
        chunk({"role": "assistant", "content": ""}),  # 1: the role, at once
        ": keep-alive",  # 2: while the prompt prefills
        chunk({"content": "def"}),  # 3: the first token
        chunk({"content": " f"}),
        chunk({"tool_calls": [{"function": {"name": "read_file", "arguments": "{}"}}]}),  # 5: the last text
        "data: " + json.dumps({"choices": [{"delta": {}, "finish_reason": "tool_calls"}], "mlx_spec": {"proposed": 2}}),
        "data: " + json.dumps({"choices": [], "usage": {"completion_tokens": 5, "prompt_tokens": 9}}),
        "data: [DONE]",
    ]

    class Client:
        @contextlib.contextmanager
        def stream(self, *_a, **_k):
            yield Lines(lines, clock)

    r = mod.stream(Client(), "http://x/", {})
    assert (r.ttft, r.last, r.total) == (3, 5, 8)
    assert r.decode_tps == 4 / 2 and r.text == "def f" and r.calls == [{"name": "read_file", "arguments": "{}"}]
    assert r.finish == "tool_calls" and r.stats == {"proposed": 2}


# ---- end to end, over real sockets


@pytest.mark.slow  # four servers in this process and mlx_lm.server in a child, 6 turns each
def test_a_tiny_agent_suite_runs_every_turn_of_every_configuration_interleaved(tool_target, tiny_models, tmp_path):
    import mlx_spec.cli  # noqa: F401  (mounts the bench: registers the agent kind with the runner)
    from mlx_spec.bench import runner

    path = tiny_suite(tmp_path / "agent-tiny.toml", tool_target, tiny_models["qwen2_draft"], mlx_lm_server=True)
    result = runner.run_suite(str(path), str(tmp_path / "runs"))
    data = json.loads(result.path.read_text())
    configs = ["none", f"hybrid:{tiny_models['qwen2_draft']}", str(tiny_models["qwen2_draft"]), "suffix"]
    configs.append("mlx_lm.server")
    turns = [t.id for s in agent_sessions.build(agent.load(str(path)).sessions) for t in s]
    assert data["complete"] and len(turns) == 6
    assert sorted((r["config"], r["prompt"]) for r in data["records"]) == sorted((c, t) for c in configs for t in turns)
    sent = sorted(data["records"], key=lambda r: r["seq"])
    for i, t in enumerate(turns):  # turn by turn: every configuration answers a turn before any answers the next
        block = sent[i * len(configs) : (i + 1) * len(configs)]
        assert {r["prompt"] for r in block} == {t}
        assert [r["config"] for r in block] == configs[i % 5 :] + configs[: i % 5]
    for r in data["records"]:
        assert 0 < r["ttft"] <= r["total"] and r["n_tokens"] > 0 and r["prompt_tokens"] > 0
        if r["config"] not in ("none", "mlx_lm.server"):
            assert r["identical"], (r["config"], r["prompt"])  # lossless: drafted replies are plain's
    plain = {r["prompt"]: r for r in data["records"] if r["config"] == "none"}
    assert any(r["cached_tokens"] for r in plain.values())  # later turns reuse the conversation's prefix
    theirs, ours = data["mlx_lm_blas"], mlx_spec_blas_path()  # mlx_lm.server ran on the BLAS this process loaded
    assert (theirs and Path(theirs).resolve()) == (ours and Path(ours).resolve())
    page = result.md_path.read_text()
    assert "| Target" in page and "aider-whole vs plain" in page and "tools vs mlx_lm.server" in page
    assert all(len(m["sha256"]) == 64 for m in data["models"].values())  # which weights were measured
    r = run_main("bench", "report", result.path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == page.strip()  # the page again, from the records alone
    r = run_main("bench", "compare", result.path, result.path)
    assert r.returncode == 0 and "| suffix" in r.stdout, r.stderr  # two agent runs compare row by row


def mlx_spec_blas_path():
    from mlx_spec import blas

    return blas.path


@pytest.mark.slow
def test_an_agent_run_refuses_to_resume_in_one_line(tool_target, tiny_models, tmp_path):
    path = tiny_suite(tmp_path / "a.toml", tool_target, tiny_models["qwen2_draft"], mlx_lm_server=False)
    r = run_main("bench", "run", path, "--resume", tmp_path / "x.json")
    assert "cannot resume" in one_line_error(r)
