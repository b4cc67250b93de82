"""Draft trees: the target's tree pass gives each node the logits of its path run as a chain (and positions by index,
or a causal mask, do not); a head's tree feeds each node beside its parent's state, attending to its ancestors only;
outputs equal plain decoding (greedy, seeded) with trees of several sizes, alone, in a hybrid, after queued plain
steps; sampled trees keep the target's law and a rule that keeps the refused children fails; the planner drafts a tree
where it pays and a chain where it does not; rows beside others draft chains."""

import mlx.core as mx
import pytest
from conftest import (
    PROMPT,
    REPEATING,
    SAMPLES,
    chi_square_pvalue_ok,
    close,
    exact_joint,
    plain_greedy,
    sample_pairs,
    spec,
    tiny,
)
from mlx_lm.models import qwen2
from mlx_lm.models.cache import make_prompt_cache
from test_eagle3 import head_drafter, random_head, rows_with_heads, run_rows

from mlx_spec.gen import tree
from mlx_spec.gen.acceptance import SourceStats
from mlx_spec.gen.cache import new_cache
from mlx_spec.gen.drafters.eagle3 import Eagle3Drafter
from mlx_spec.gen.drafters.hybrid import HybridDrafter
from mlx_spec.gen.drafters.suffix import SuffixDrafter
from mlx_spec.gen.joint import JointCache
from mlx_spec.gen.planner import PLAIN, Ask, Outcome, Plan, Planner, tree_key
from mlx_spec.gen.sampling import Sampler
from mlx_spec.gen.tunables import TREE_PER_DEPTH, TREE_WIDTH


class Trees(Planner):
    """Drafts every round as a non-adaptive planner would, a tree of `nodes` tokens where the row may draft one;
    `plain`: the rounds (1-based, mod 3) that are plain steps instead (queued ahead, then read as queued)."""

    def __init__(self, nodes=7, plain=()):
        super().__init__(adaptive=False)
        self.nodes, self.plain, self.n = nodes, plain, 0

    def plan(self, asks, places=None, pad=False, queued=False):
        self.n += 1
        p = super().plan(asks, places, pad, queued)
        if self.n % 3 in self.plain:
            return PLAIN
        if p.k and asks[0].tree and p.sources[0] == asks[0].costly:
            return Plan(p.k, p.sources, self.nodes + 1, tree=self.nodes)
        return p


def wide(vocab=64, layers=2, seed=0):
    args = qwen2.ModelArgs(
        model_type="qwen2",
        hidden_size=32,
        num_hidden_layers=layers,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        rms_norm_eps=1e-6,
        vocab_size=vocab,
        rope_theta=10000.0,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    mx.random.seed(seed)
    m = qwen2.Model(args)
    mx.eval(m.parameters())
    return m


PARENTS = [-1, -1, 0, 0, 1, 2, 5]
NODES = [5, 6, 8, 12, 13, 14, 20]


def _path(j):
    out = []
    while j >= 0:
        out.append(NODES[j])
        j = PARENTS[j]
    return out[::-1]


@pytest.mark.parametrize("broken", ["", "positions by index", "causal mask"])
def test_a_tree_pass_gives_each_node_the_logits_of_its_path_run_as_a_chain(broken, monkeypatch):
    m = wide()
    context = [3, 7, 9, 11, 2, 40, 33]
    cache = make_prompt_cache(m)
    m(mx.array(context[:-1])[None], cache=cache)
    width = 1 + len(NODES) + 2  # padded as a verify size would be
    mask, at = tree.layout(PARENTS, width, True, cache[0].offset)
    if broken == "positions by index":
        at = mx.arange(width)
    elif broken == "causal mask":
        mask = mx.tril(mx.ones((width, width), dtype=mx.bool_), k=cache[0].offset)
        mask = mx.concatenate([mx.ones((width, cache[0].offset), dtype=mx.bool_), mask[:, :width]], axis=1)
    x = mx.array([context[-1]] + NODES + [0, 0])[None]
    view = tree.view(m)
    out = view.run(lambda v: v(x, cache=cache), mask, at)[0]
    worst = mx.abs(m(mx.array(context)[None])[0, -1] - out[0]).max().item()
    for j in range(len(NODES)):
        want = m(mx.array(context + _path(j))[None])[0, -1]
        worst = max(worst, mx.abs(want - out[j + 1]).max().item())
    assert (worst < 1e-4) != bool(broken), worst
    assert cache[0].offset == len(context) - 1 + width
    fresh = make_prompt_cache(m)  # the model itself is unchanged: a plain pass reads no tree
    assert close(m(mx.array(context)[None], cache=fresh)[0, -1], m(mx.array(context)[None])[0, -1])


@pytest.mark.parametrize("broken", [False, True])
def test_a_heads_tree_feeds_each_node_beside_its_parents_state_attending_to_its_ancestors(broken, monkeypatch):
    """Every node's children are the head's likeliest tokens after that node's path drafted as a chain; a mask in
    which a node sees every node fed before fails."""
    if broken:
        monkeypatch.setattr(Eagle3Drafter, "_ancestor", staticmethod(lambda a, c, parent: True))
    vocab, reads = 64, (0, 1, 2)
    head = random_head(3, vocab, vocab, 32, reads, scale=2.0)
    d = Eagle3Drafter(head, reads, vocab)
    context = [3, 7, 9, 11, 2, 40, 33, 5]
    states = mx.random.normal((1, len(context), 96), key=mx.random.key(1))

    def fed():
        cache = new_cache(head)
        return cache, head(mx.array(context)[None], states, cache)[:, -1]

    cache, state = fed()
    rows = JointCache()
    rows.add(d, cache)
    k = 3
    tokens, parents = d.tree(state, k, 1000, rows)
    assert cache[0].offset == len(context)  # the tree's entries are dropped
    tokens, depth = tokens.tolist(), tree.depths(parents)
    assert len(tokens) == TREE_WIDTH + (k - 1) * TREE_WIDTH**2 and max(depth) == k
    kids = tree.children(parents)
    fed_nodes = [j for j in kids if j >= 0]
    assert fed_nodes and max(depth[j] for j in fed_nodes) == k - 1
    worst = True
    for j in fed_nodes:
        path, a = [], j
        while a >= 0:
            path.append(tokens[a])
            a = parents[a]
        cache2, h = fed()
        for t in path[::-1]:  # the chain: each token fed beside the head's own state before it
            h = head(mx.array([[t]]), h[:, None], cache2)[:, -1]
        want = set(mx.argsort(-head.logits(h)[0])[:TREE_WIDTH].tolist())
        worst = worst and {tokens[c] for c in kids[j]} == want
    assert worst != broken


def test_tree_drafts_equal_plain_greedy_alone_in_a_hybrid_and_after_queued_steps():
    target = tiny(1, 3.0, layers=3)
    for prompt in (PROMPT, REPEATING, [2, 2, 1, 0, 2, 2, 1]):
        want = plain_greedy(target, prompt, 16)
        for planner in (Trees(1), Trees(7), Trees(15), Trees(7, plain=(1, 2))):
            toks, stats = spec(target, prompt, head_drafter(target), max_tokens=16, num_draft=3, planner=planner)
            assert toks == want
            assert any(e.get("tree") for e in stats.trace), "no round drafted a tree"
        hybrid = HybridDrafter([SuffixDrafter()], head_drafter(target))
        toks, stats = spec(target, prompt, hybrid, max_tokens=16, num_draft=3, planner=Trees(7))
        assert toks == want


def test_seeded_sampling_through_trees_gives_the_seeded_plain_tokens():
    target = tiny(2, 1.0, layers=3)
    for seed in (1, 2, 3):
        want, _ = spec(target, REPEATING, None, max_tokens=12, temp=1.0, seed=seed)
        toks, stats = spec(
            target,
            REPEATING,
            head_drafter(target, scale=4.0),
            max_tokens=12,
            num_draft=3,
            temp=1.0,
            seed=seed,
            planner=Trees(7),
        )
        assert toks == want and any(e.get("tree") for e in stats.trace)


@pytest.mark.slow  # a chi-square law (about 30 s)
@pytest.mark.parametrize("broken", [False, True])
def test_sampled_trees_keep_the_targets_law_and_a_rule_that_keeps_the_refused_children_fails(broken, monkeypatch):
    if broken:
        monkeypatch.setattr(tree, "_without", lambda q, refused: q)
    spread = tiny(2, 1.0, layers=3)
    kw = dict(temp=1.0)
    trees = []

    def one():
        toks, stats = spec(
            spread, PROMPT, head_drafter(spread, scale=4.0), max_tokens=3, num_draft=2, planner=Trees(3), **kw
        )
        trees.append(stats.trace[0].get("tree", 0))
        return toks

    n = SAMPLES // 2 if broken else SAMPLES  # the broken rule's chi-square on 400: 132 against 45
    ok, stat, crit = chi_square_pvalue_ok(sample_pairs(one, n), exact_joint(spread, Sampler(**kw).probs), n)
    assert min(trees) == 3, "every sample's first round drafts a tree"
    assert ok != broken, f"{'broken' if broken else 'exact'} rule: chi2 {stat:.1f} vs {crit:.1f}"


def test_rows_beside_others_draft_chains_and_equal_their_solo_runs():
    target = tiny(1, 3.0, layers=3)
    prompts, maxes = [REPEATING, PROMPT], [14, 12]
    e, rows = rows_with_heads(target, prompts, [head_drafter(target), head_drafter(target)], maxes)
    e.planner = Trees(7)
    for r in rows:
        r.stats.trace = []
    outs = run_rows(e)
    for r, p, m in zip(rows, prompts, maxes):
        assert outs[id(r)] == plain_greedy(target, p, m)
    together = [x for r in rows for x in r.stats.trace[:3]]
    assert together and not any(x.get("tree") for x in together)


def _planner(verify: dict, draft: float) -> Planner:
    """A planner that measured a pass of each size at `verify` seconds, and the head's rounds, its chains' and its
    trees' (TREE_PER_DEPTH tokens a depth), at their pass and `draft` seconds a depth."""
    p = Planner()
    for size, s in verify.items():
        for _ in range(3):
            p.costs.time_pass((1, size), s)
    for key, per in (("eagle3", 1), (tree_key("eagle3"), TREE_PER_DEPTH)):
        for k in (1, 2, 3, 5):
            size = min(s for s in verify if s > per * k)  # padded to a size timed, as the engine pads a tree
            p.costs.time_draft(key, 1, k, 0, 1, size, verify[size] + draft * k)
    return p


def _ask(chain: float, first_tree: float) -> Ask:
    accept = {"eagle3": SourceStats(), tree_key("eagle3"): SourceStats()}
    for _ in range(40):
        accept["eagle3"].observe(3, 3 if chain > 0.5 else 0)
        accept[tree_key("eagle3")].observe(3, 3 if first_tree > 0.5 else 0)
    return Ask(accept, costly="eagle3", cap=7, left=100, tree=True)


def test_the_planner_drafts_a_tree_where_it_pays_and_a_chain_where_it_does_not():
    sizes = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
    flat = _planner({s: 0.100 + 0.001 * s for s in sizes}, 0.002)  # a wide pass costs little more than a step
    plan = flat.plan([_ask(chain=0.0, first_tree=1.0)], pad=True)
    assert plan.tree > 0 and plan.k >= 1
    steep = _planner({s: 0.100 * s for s in sizes}, 0.002)  # each position costs a step: trees cannot pay
    plan = steep.plan([_ask(chain=1.0, first_tree=1.0)], pad=True)
    assert plan.tree == 0
    alone = flat.plan([Ask(_ask(0.0, 1.0).accept, costly="eagle3", cap=7, left=100, tree=False)], pad=True)
    assert alone.tree == 0  # a row that may not draft a tree is never given one


def test_a_tree_never_measured_is_taken_to_accept_as_its_chains_and_is_tried_by_one_probe():
    sizes = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
    p = _planner({s: 0.100 + 0.001 * s for s in sizes}, 0.002)
    chain = SourceStats()
    for _ in range(40):
        chain.observe(3, 1)
    ask = Ask({"eagle3": chain}, costly="eagle3", cap=7, left=100, tree=True)
    plans = []
    while len(plans) < 12 and not (plans and plans[-1].tree):
        plans.append(plan := p.plan([ask], pad=True))
        seconds = 0.100 + 0.001 * plan.size + 0.002 * plan.k
        p.record(plan, 1, seconds, [Outcome(ask.accept, "eagle3", plan.k, 1, costly=True)], asks=[ask])
    assert plans[0].k and not plans[0].tree  # as good as its chain: a tree is not chosen on a guess
    assert plans[-1].tree and plans[-1].probe and len(plans) > 2  # tried once its chains earned the credit
