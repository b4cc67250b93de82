"""Generating with the target sharded over ranks: rank 0's plan on every rank, greedy replies equal to plain sharded
decoding over 2 ranks on this machine (MLX's ring backend over loopback), and a killed rank ending every rank."""

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import PROMPTS, make_model

from mlx_spec.cluster import Agreed, Cluster, ClusterError
from mlx_spec.cluster.agree import encode
from mlx_spec.errors import GenerationError
from mlx_spec.gen.planner import PLAIN, Ask, Plan, Planner

RANKS = Path(__file__).with_name("cluster_ranks.py")
LAUNCH = Path(sys.executable).with_name("mlx.launch")


class Rank:
    """Stands in for a rank of a group: shares what rank 0 would have shared."""

    def __init__(self, rank: int, shared: list[int] | None = None, size: int = 2):
        self._rank, self._size, self.shared, self.sent = rank, size, shared, []

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


class Shared(Cluster):
    """A Cluster over a `Rank` whose collective returns the `Rank`'s values (rank 0's: what it was given)."""

    def share(self, values, n, limit=math.inf):
        self.group.sent.append(list(values))
        return list(values) if self.lead else self.group.shared


def asks() -> list[Ask]:
    return [Ask({}, ("ngram", 4), left=20), Ask({}, ("", 0), costly="model", cap=3, left=9)]


def test_a_follower_takes_rank_zeros_plan_not_its_own():
    lead = Plan(3, ("ngram", "model"), 4, probe=True)
    assert Planner(adaptive=True).plan(asks()) == PLAIN  # its own: nothing is timed yet
    follower = Agreed(adaptive=True, cluster=Shared(Rank(1, encode(lead, asks()))), limit=math.inf)
    assert follower.plan(asks()) == lead


def test_rank_zero_plans_and_shares_its_plan():
    cluster = Shared(Rank(0))
    plan = Agreed(adaptive=False, cluster=cluster, limit=math.inf).plan(asks())
    assert plan == Planner(adaptive=False).plan(asks()) and plan.k == 4
    follower = Agreed(adaptive=True, cluster=Shared(Rank(1, cluster.group.sent[0])), limit=math.inf)
    assert follower.plan(asks()) == plan


def test_a_follower_that_diverged_stops_with_an_error_naming_it():
    behind = asks()
    behind[1].left = 8  # one token fewer left: its reply went another way
    follower = Agreed(cluster=Shared(Rank(1, encode(PLAIN, asks()))), limit=math.inf)
    with pytest.raises(ClusterError, match="rank 1 diverged from rank 0: row 1 has 8 tokens left"):
        follower.plan(behind)


def test_a_lost_peer_is_one_error_naming_both_ranks():
    with pytest.raises(ClusterError, match="rank 0: the group broke: rank 1 failed or its link dropped"):
        with Cluster(Rank(0)).guard():
            raise RuntimeError("[ring] connection to a peer was lost")
    with pytest.raises(ClusterError, match="^rank 1: bad draft$"):
        with Cluster(Rank(1)).guard():
            raise GenerationError("bad draft")
    with pytest.raises(ZeroDivisionError):  # not the group's: left as it is
        with Cluster(Rank(1)).guard():
            raise ZeroDivisionError


DEADLINE = """
import time
from mlx_spec.cluster.group import Cluster, Deadline
from test_cluster import Rank
with Deadline(Cluster(Rank(0)), 0.5):
    time.sleep({wait})
"""


@pytest.mark.parametrize("wait", [3, 0])
def test_a_wait_past_its_deadline_ends_the_process_with_the_groups_error(wait):
    start = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-c", DEADLINE.format(wait=wait)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
        timeout=120,
    )
    if not wait:
        assert res.returncode == 0 and res.stderr == "", res.stderr
        return
    assert res.returncode == 1 and time.monotonic() - start < 60
    broke = "error: rank 0: the group broke: rank 1 failed or its link dropped (no word from the group in 0.5 s)"
    assert res.stderr == broke + "\n"


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """A 2-layer tiny qwen2 (mlx-lm shards qwen2 by tensor): each layer's collectives cost a loopback round trip."""
    return make_model(tmp_path_factory.mktemp("cluster") / "qwen2", "qwen2", seed=0, layers=2, scale=4.0)


@pytest.mark.slow
def test_every_drafter_sharded_over_two_ranks_equals_plain_sharded(target, tmp_path):
    out = tmp_path / "replies.json"
    # the target drafts for itself, loaded whole on each rank
    drafters = ["none", "ngram", "suffix", str(target), f"{target}@unlike", "none@sampled", f"{target}@sampled"]
    prompt = PROMPTS[0] + PROMPTS[1] + PROMPTS[0]  # n-gram bait
    args = [str(target), str(out), json.dumps([prompt]), json.dumps(drafters), "12", "0"]
    res = subprocess.run(
        [sys.executable, str(LAUNCH), "-n", "2", "--backend", "ring", "--", sys.executable, str(RANKS), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(out.read_text())
    replies = got["replies"]
    plain, sampled = replies.pop("none"), replies.pop("none@sampled")
    assert len(plain[0]) == len(sampled[0]) == 12 and sampled != plain
    assert replies == {d: sampled if d.endswith("@sampled") else plain for d in drafters if not d.startswith("none")}
    proposed = {d: p for d, (p, _) in got["accepted"].items()}
    assert all(proposed[d] > 0 for d in replies), proposed  # every drafter's drafts were verified sharded
    assert got["accepted"][str(target)][1] > 0


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.mark.slow
def test_a_killed_rank_ends_the_generation_on_every_rank_with_one_error(target, tmp_path):
    hostfile = tmp_path / "hosts.json"  # what `mlx.launch -n 2 --backend ring` writes for two local ranks
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(2)]))
    cmd = [sys.executable, "-m", "mlx_spec.cli", "generate", "--model", str(target), "--draft", "ngram"]
    cmd += ["--shard", "tensor", "--no-chat", "--max-tokens", "400"]
    ranks = [
        subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(os.environ, MLX_RANK=str(r), MLX_HOSTFILE=str(hostfile)),
        )
        for r in range(2)
    ]
    try:
        printed = threading.Event()
        threading.Thread(target=lambda: ranks[0].stdout.read(1) and printed.set(), daemon=True).start()
        assert printed.wait(300), "rank 0 printed nothing"
        ranks[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        rc = ranks[0].wait(timeout=30)
        assert time.monotonic() - killed < 10
        err = ranks[0].stderr.read().decode()
        assert rc == 1 and "Traceback" not in err, err
        assert err.strip().splitlines()[-1].startswith("error: rank 0: the group broke: rank 1 failed"), err
        assert ranks[1].stdout.read() == b""  # rank 0 alone prints the reply
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
            p.wait()
