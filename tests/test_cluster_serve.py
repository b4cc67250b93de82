"""`serve --shard tensor` over 2 ranks on this machine (MLX's ring backend over loopback): rank 0 serves, rank 1
replays its steps; replies equal plain sharded decoding's and one machine's, and a killed rank is a 503, not a hang."""

import json
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import openai
import pytest
from conftest import PROMPTS, make_model
from test_cluster import Rank, local_ranks

from mlx_spec.cluster import Cluster
from mlx_spec.server.errors import ApiError
from mlx_spec.server.lockstep import STEP_LIMIT, Lockstep, SharedStep, decode, encode
from mlx_spec.server.params import Params
from mlx_spec.server.scheduler import Job, Scheduler

RANKS = Path(__file__).with_name("cluster_serve_ranks.py")
ASKS = [PROMPTS[0] + PROMPTS[1] + PROMPTS[0], PROMPTS[2]]  # the first is n-gram bait, as in test_cluster
MAX_TOKENS = 16


def test_a_step_reads_back_as_rank_zero_wrote_it():
    p = Params(12, temp=0.7, top_p=0.9, seed=3, stop=["\n\n"], draft="none")
    step = SharedStep([("chatcmpl-1", [5, 6, 7], p)], {"chatcmpl-0"})
    assert decode(1, encode(step)) == step
    assert encode(SharedStep()) == b"" and decode(1, b"") == SharedStep() and decode(2, b"").stop


def test_a_broken_group_answers_new_requests_with_a_503_naming_the_rank_and_health_says_so(tiny_models):
    from mlx_spec.server.pair import Pair

    scheduler = Scheduler(Pair.load(str(tiny_models["qwen2"]), "none"), 4)
    lockstep = Lockstep(Cluster(Rank(0)))  # a stand-in group: nothing here runs a collective
    scheduler.shard(lockstep)
    assert scheduler.health()["max_concurrency"] == 1 and scheduler.health()["sharded"]["one_request_at_a_time"]
    waiting = []
    scheduler.submit(Job("a", [1, 2], Params(4), waiting.append))
    assert lockstep.broke(RuntimeError("[ring] connection to a peer was lost"))
    assert waiting[0].error.status == 503  # the request waiting ended too
    with pytest.raises(ApiError) as e:
        scheduler.submit(Job("b", [1, 2], Params(4), waiting.append))
    assert e.value.status == 503 and "rank 0: the group broke: rank 1 failed or its link dropped" in e.value.message
    assert scheduler.health()["status"] == "broken"


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """A 2-layer tiny qwen2 in float32 (sharded by tensor, its greedy replies equal one machine's: docs/cluster.md)."""
    return make_model(tmp_path_factory.mktemp("serve") / "qwen2", "qwen2", seed=0, layers=2, scale=4.0)


class Ranks:
    """Two ranks of `serve --shard tensor` started as `mlx.launch -n 2 --backend ring` starts them on one machine
    (`MLX_RANK`, `MLX_HOSTFILE`); `url` once rank 0 listens."""

    def __init__(self, target: Path, tmp: Path, mode: str = "as-is", extra: tuple[str, ...] = ()):
        args = ["--model", str(target), "--draft", "ngram", "--num-draft", "3", "--shard", "tensor", "--port", "0"]
        args += extra
        self.procs = [
            subprocess.Popen(
                [sys.executable, str(RANKS), mode, *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
            for env in local_ranks(tmp)
        ]
        line: list[bytes] = []
        reader = threading.Thread(target=lambda: line.append(self.procs[0].stdout.readline()), daemon=True)
        reader.start()
        reader.join(300)
        assert line and line[0].startswith(b"http"), self.stop()
        self.url = line[0].decode().strip()
        self.client = openai.OpenAI(base_url=self.url + "v1", api_key="unused", max_retries=0, timeout=60)

    def reply(self, prompt: str, **extra):
        return complete(self.client, prompt, **extra)

    def health(self) -> dict:
        with urllib.request.urlopen(self.url + "health", timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> str:
        """End both ranks; their stderr."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        return "\n".join(p.stderr.read().decode() for p in self.procs)


SAMPLED = {"temperature": 0.8, "seed": 7}  # a seeded row samples by the Gumbel-max rule: the same tokens on any rank


def complete(client, prompt: str, temperature: float = 0.0, seed: int | None = None, **extra):
    """A completion of MAX_TOKENS tokens through the official client (`extra`: this server's own fields)."""
    return client.completions.create(
        model="m", prompt=prompt, max_tokens=MAX_TOKENS, temperature=temperature, seed=seed, extra_body=extra
    )


def one_machine(target: Path) -> list[str]:
    """Greedy replies to ASKS, then one seeded sampled reply, by the server on one machine, the target whole."""
    from mlx_spec.server.app import build_app
    from mlx_spec.server.main import Running
    from mlx_spec.server.pair import Pair

    with Running(build_app(Pair.load(str(target), "none"), max_concurrency=2)) as srv:
        client = openai.OpenAI(base_url=srv.url + "v1", api_key="unused", max_retries=0, timeout=60)
        return [complete(client, q).choices[0].text for q in ASKS] + [
            complete(client, ASKS[1], **SAMPLED).choices[0].text
        ]


@pytest.mark.slow
def test_served_over_two_ranks_replies_equal_plain_sharded_and_one_machines(target, tmp_path):
    alone = one_machine(target)
    ranks = Ranks(target, tmp_path, extra=("--no-adaptive",))  # an adaptive planner may judge drafting a loss on a
    # busy machine: drafting every offer, what is asserted of it does not hang on timings
    try:
        left(ranks)
        plain = [ranks.reply(q, draft="none").choices[0].text for q in ASKS]
        drafted: list = [None] * len(ASKS)

        def ask(i: int) -> None:
            drafted[i] = ranks.reply(ASKS[i])

        together = [threading.Thread(target=ask, args=(i,)) for i in range(len(ASKS))]  # sent at once, run in turn
        [t.start() for t in together]
        [t.join(120) for t in together]
        sampled = ranks.reply(ASKS[1], **SAMPLED).choices[0].text
        replies = [r.choices[0].text for r in drafted] + [sampled]
        assert plain + [sampled] == alone and replies == alone, (plain, replies, alone)
        assert drafted[0].model_extra["mlx_spec"]["drafted"] > 0  # the n-gram bait was drafted
        health = ranks.health()
        assert health["sharded"] == {"ranks": 2, "one_request_at_a_time": True, "error": None}
        assert health["completed"] == 5 and health["max_concurrency"] == 1
        ranks.procs[0].send_signal(signal.SIGINT)  # rank 0 stops: its last step tells rank 1 to stop
        assert ranks.procs[1].wait(60) == 0 and ranks.procs[0].wait(60) in (0, 130)
    finally:
        ranks.stop()


@pytest.mark.slow
# killed: its sockets closed; frozen: its sockets left open and silent
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_a_killed_or_frozen_follower_ends_the_reply_with_an_error_and_new_requests_get_a_503(target, tmp_path, how):
    ranks = Ranks(target, tmp_path)
    try:
        stream = ranks.client.completions.create(model="m", prompt=ASKS[0], max_tokens=2000, stream=True)
        next(iter(stream))  # the reply has started
        ranks.procs[1].send_signal(how)
        ended: list[BaseException] = []
        reader = threading.Thread(target=lambda: ended.append(drained(stream)), daemon=True)
        reader.start()
        # a stream kept alive by keep-alive comments never times out in the client: a cap that fails only on a hang
        # (a silent peer: rank 0 waits out its step's bound first)
        reader.join(STEP_LIMIT + 120)
        assert ended, "the reply hung"
        assert isinstance(ended[0], openai.APIError) and "rank 1 failed" in str(ended[0]), ended
        with pytest.raises(openai.APIStatusError) as e:  # the client's 60 s timeout fails it on a hang
            ranks.reply(ASKS[1])
        assert e.value.status_code == 503 and "rank 0: the group broke: rank 1 failed" in e.value.message
        health = ranks.health()
        assert health["status"] == "broken" and "rank 1 failed" in health["sharded"]["error"]
    finally:
        ranks.stop()


def drained(stream) -> BaseException | None:
    """Read a stream to its end; the error that ended it, if one did."""
    try:
        for _ in stream:
            pass
    except Exception as e:
        return e
    return None


def left(ranks: Ranks) -> None:
    """A client that leaves mid-reply: every rank must drop its request at the same step."""
    stream = ranks.client.completions.create(model="m", prompt=ASKS[1], max_tokens=2000, stream=True)
    next(iter(stream))
    stream.close()


@pytest.mark.slow
@pytest.mark.parametrize("broken", ["no-admit", "no-cancel"])
def test_followers_that_skip_rank_zeros_admission_or_cancel_fail_the_next_request_with_a_503_not_a_hang(
    target, tmp_path, broken
):
    ranks = Ranks(target, tmp_path, broken)  # rank 1 never runs an admitted request, or runs a cancelled one on
    try:
        if broken == "no-cancel":
            left(ranks)
        with pytest.raises(openai.APIStatusError) as e:  # the client's 60 s timeout fails it on a hang
            ranks.reply(ASKS[0])
        assert e.value.status_code == 503, e.value
    finally:
        ranks.stop()
