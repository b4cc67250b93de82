"""The server's pieces without a socket: stop strings, request checks, the session pool's choice, the wire format."""

import pytest

from mlx_spec.server import params as P
from mlx_spec.server.errors import ApiError
from mlx_spec.server.pair import Pair
from mlx_spec.server.pool import SessionPool
from mlx_spec.server.scheduler import Delta, Done
from mlx_spec.server.stops import Mark, StopText
from mlx_spec.server.wire import CompletionReply


def feed(stop, tokens):
    s, out = StopText(stop), []
    for text, flag in tokens:
        out += s.add(text, flag)
        if s.hit:
            break
    return out + s.flush(), s.hit


def test_stop_text_releases_everything_at_once_without_stops():
    out, hit = feed([], [("ab", True), ("", False), ("c", False)])
    assert out == [("ab", True), ("", False), ("c", False)] and not hit


def test_stop_text_cuts_a_stop_spanning_tokens_and_keeps_flags():
    out, hit = feed(["END"], [("ab", True), ("cE", False), ("N", True), ("Dzz", False), ("more", True)])
    assert hit and out == [("ab", True), ("c", False)]


def test_stop_text_holds_back_a_possible_stop_then_lets_it_go():
    s = StopText(["END"])
    assert s.add("ab", True) == [("ab", True)]
    assert s.add("cE", False) == []  # "E" may begin "END": the whole token waits
    assert s.add("Nx", True) == [("cE", False), ("Nx", True)]
    assert not s.hit


def test_stop_text_picks_the_earliest_of_several_stops():
    out, hit = feed(["zz", "b"], [("abzz", False)])
    assert hit and out == [("a", False)]


def body(**kw):
    return dict({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, **kw)


@pytest.mark.parametrize(
    "bad, param",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=-3), "max_tokens"),
        (dict(max_tokens="9"), "max_tokens"),
        (dict(max_completion_tokens=0), "max_completion_tokens"),
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=2.5), "temperature"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=True), "top_p"),
        (dict(stop=[1]), "stop"),
        (dict(stop=["a"] * 5), "stop"),
        (dict(n=2), "n"),
        (dict(seed=-1), "seed"),
    ],
)
def test_params_reject_out_of_range_options_naming_the_field(bad, param):
    with pytest.raises(ApiError) as e:
        P.params(body(**bad), 16)
    assert e.value.status == 400 and e.value.param == param


def test_params_defaults_and_unknown_fields():
    p = P.params(
        body(
            frequency_penalty=1,
            user="x",
            logit_bias={},
            stream=True,
            stream_options={"include_usage": True},
            stop="\n\n",
        ),
        16,
    )
    assert (p.max_tokens, p.temp, p.stop, p.stream, p.include_usage) == (16, 0.0, ["\n\n"], True, True)
    assert P.params(body(max_tokens=5, max_completion_tokens=7), 16).max_tokens == 7


@pytest.mark.parametrize(
    "msgs",
    [
        None,
        [],
        "hi",
        [{"role": "wizard", "content": "x"}],
        [{"content": "x"}],
        [{"role": "user", "content": 3}],
        ["hi"],
    ],
)
def test_messages_rejects_malformed_lists_and_unknown_roles(msgs):
    with pytest.raises(ApiError) as e:
        P.messages({"messages": msgs})
    assert e.value.status == 400 and e.value.param.startswith("messages")


def test_messages_joins_text_parts():
    msgs = P.messages(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    )
    assert msgs == [{"role": "user", "content": "ab"}]


def test_parse_json_rejects_non_objects():
    for raw in (b"{bad", b"[1]", b"\xff"):
        with pytest.raises(ApiError):
            P.parse_json(raw)


class FakeSession:
    def __init__(self, n):
        self.tokens, self.n = [], n


def test_pool_takes_the_idle_session_sharing_the_longest_prefix_and_stays_bounded():
    made = []
    pool = SessionPool(lambda: made.append(FakeSession(len(made))) or made[-1], limit=2)
    a, b = pool.acquire([1, 2, 3]), pool.acquire([7, 8])
    a.tokens, b.tokens = [1, 2, 3, 4], [7, 8, 9]
    pool.release(a)
    pool.release(b)
    assert pool.acquire([7, 8, 9, 10]) is b  # the continuing conversation gets its own cache back
    pool.release(b)
    assert pool.acquire([5]) is a  # nothing shared and the pool is full: the least recently used
    assert pool.total == 2 and len(made) == 2


def test_reply_chunks_carry_flags_and_the_last_one_the_stats():
    r = CompletionReply("chatcmpl-1", "tiny", chat=True)
    pieces = [("a", Mark(1, 3)), ("b", Mark(0, 3)), ("c", Mark(0, 4))]
    c = r.chunk(Delta(pieces, dict(tokens=3, rounds=2, spec_rounds=1, drafted=3, accepted=1)))
    assert c["choices"][0]["delta"] == {"content": "abc"}
    x = c["mlx_spec"]
    assert (x["draft"], x["pos"], x["round"], x["pieces"]) == (
        [True, False, False],
        [1, 0, 0],
        [3, 3, 4],
        ["a", "b", "c"],
    )
    done = Done(
        "length", {"prompt_tokens": 5, "prompt_cached": 2, "generation_tokens": 2, "proposed": 3, "generation_tps": 9.0}
    )
    last = r.last(done)
    assert last["choices"][0]["finish_reason"] == "length" and last["mlx_spec"]["drafted"] == 3
    assert r.usage_chunk(done)["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 2},
    }


def test_a_request_may_name_any_drafter_that_builds_nothing_or_is_allowed_unless_the_drafter_is_fixed():
    pair = Pair("m", "suffix", None, None, loaded={"d": None})
    assert pair.choices()[:2] == ["suffix", "none"] and {"ngram", "self", "d", "hybrid:d"} <= set(pair.choices())
    assert pair.check_draft(None) is None and pair.check_draft("hybrid:d") == "hybrid:d"
    assert Pair("m", "suffix", None, None, allowed=("quant-self",)).check_draft("quant-self") == "quant-self"
    for bad, words in (
        ("other-model", "builds no drafter per request"),
        ("quant-self", "--allow-draft"),
        ("self:x", "self"),
        (5, "drafter spec"),
    ):
        with pytest.raises(ApiError) as e:
            pair.check_draft(bad)
        assert e.value.status == 400 and e.value.param == "draft" and words in str(e.value), str(e.value)
    fixed = Pair("m", "suffix", None, None, fixed=True)
    assert fixed.choices() == ["suffix"] and fixed.check_draft("suffix") == "suffix"
    with pytest.raises(ApiError, match="fixed"):
        fixed.check_draft("none")
