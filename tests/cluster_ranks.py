"""What each rank runs in the cluster tests (`mlx.launch -n 2 --backend ring -- python tests/cluster_ranks.py ...`):
the tiny target sharded over the group, the replies by every drafter asked for (a spec as `generate --shard` takes
it: 'mtp' reads the target's folder) and the drafts each rank made, as JSON; or (`law`) the chi-square check of
sampled replies."""

import json
import sys

import mlx.core as mx

from mlx_spec.cluster import Agreed, Cluster
from mlx_spec.gen.load import load_folder
from mlx_spec.gen.registry import parse
from mlx_spec.gen.stream import generate
from mlx_spec.named import make_drafter

# A run is a drafter spec, "@unlike": the followers' own planners would plan otherwise (adaptive; rank 0's is not),
# "@sampled": at temperature 0.8 with a seed (a seeded row samples by the Gumbel-max rule: the same tokens as plain).
UNLIKE, SAMPLED = "unlike", "sampled"


def recorded(drafter, drafts: list[list[int]]):
    """`drafter`, its drafting writing down every draft it makes on this rank (the tokens, read as they are made)."""
    make = drafter.drafting

    def drafting():
        inner = make()
        propose = inner.propose

        def writing(*args, **kw):
            out = propose(*args, **kw)
            drafts.extend(d.tokens.tolist() for d in out)
            return out

        inner.propose = writing
        return inner

    drafter.drafting = drafting
    return drafter


def runs(folder, model, tok, prompts, drafters, max_tokens, cluster: Cluster | None) -> dict[str, dict]:
    """{"replies": {run: [tokens per prompt]}, "accepted": {run: [proposed, accepted]}, "drafts": {run: [this rank's
    costly drafts]}} over `model` (of `folder`), sharded over `cluster` or whole (None)."""
    replies, accepted, drafts = {}, {}, {}
    for run in drafters:
        spec, _, mode = run.partition("@")
        parsed = cluster.drafter(parse(spec), folder) if cluster is not None else parse(spec)
        drafts[run] = []
        drafter = recorded(make_drafter(parsed, model, tok), drafts[run]) if spec != "none" else None
        adaptive = mode == UNLIKE and cluster is not None and not cluster.lead
        sampling = {"temp": 0.8, "seed": 7} if mode == SAMPLED else {}
        outs = [
            generate(
                model,
                tok,
                p,
                drafter,
                max_tokens=max_tokens,
                eos_token_ids=(),
                adaptive=adaptive,
                planner=Agreed(adaptive=adaptive, cluster=cluster) if cluster is not None else None,
                **sampling,
            )
            for p in prompts
        ]
        replies[run] = [r.tokens for r in outs]
        accepted[run] = [sum(r.stats.proposed for r in outs), sum(r.stats.accepted for r in outs)]
    return {"replies": replies, "accepted": accepted, "drafts": drafts}


def main(target: str, out: str, prompts: list[str], drafters: list[str], max_tokens: int, single: bool):
    """Every run sharded; where `single`, on rank 0 every run on the target loaded whole too, as "RUN alone". Rank 0
    writes `out`, rank r > 0 its drafts to `out`.r."""
    cluster = Cluster.join("tensor")
    model, tok = cluster.load(target)
    cluster.agree_seed(None)  # as the CLI does
    with cluster.guard():
        got = runs(target, model, tok, prompts, drafters, max_tokens, cluster)
    if single and cluster.lead:
        alone = runs(target, load_folder(target)[0], tok, prompts, drafters, max_tokens, None)
        for key, mine in alone.items():
            got[key].update({f"{run} alone": v for run, v in mine.items()})
    with open(out if cluster.lead else f"{out}.{cluster.rank}", "w") as f:
        json.dump(got if cluster.lead else got["drafts"], f)


# The law runs: every rank seeds each sample alike; "apart": each rank its own seed (the broken version, ranks drawing
# different drafts and verdicts); "resample": the residual forgets to subtract the draft's law (the broken rule).
ALIKE, APART, RESAMPLE = "alike", "apart", "resample"
READS = (0, 0, 0)  # the one block's output, three times: what the head reads


def law(out: str, how: str, samples: int) -> None:
    """The chi-square check over the group: `samples` replies of N_TOKENS tokens sampled at temperature 1 by a tiny
    V-token qwen2 sharded by tensor, drafted K=2 by a random EAGLE-3 head on every rank; rank 0 writes
    {"ok", "stat", "crit", "verified": [fewest, most draft positions a reply verified]}; a broken group ends every
    rank with its error."""
    from conftest import N_TOKENS, PROMPT, V, chi_square_pvalue_ok, exact_joint, randomized
    from mlx_lm.models import qwen2
    from test_eagle3 import random_head

    from mlx_spec.gen import verify
    from mlx_spec.gen.drafters.eagle3 import Eagle3Drafter
    from mlx_spec.gen.generate import Stats, speculative_generate_step
    from mlx_spec.gen.sampling import Sampler

    cluster = Cluster.join("tensor")
    args = qwen2.ModelArgs(  # conftest.tiny's spread target of one block, a key/value head for each of the 2 ranks
        model_type="qwen2",
        hidden_size=32,
        num_hidden_layers=1,  # each layer's collectives cost a loopback round trip
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        vocab_size=V,
        rope_theta=10000.0,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    whole = randomized(qwen2.Model, args, 2, 1.0)
    model = randomized(qwen2.Model, args, 2, 1.0)
    model.shard(cluster.group)  # what mlx-lm's sharded_load does to a loaded model
    head = random_head(5, V, V, args.hidden_size, READS, 8.0)  # peaked: it disagrees with the target often
    if how == RESAMPLE:
        verify._residual = lambda q, p: q
    counts: dict[tuple, int] = {}
    verified = []
    with cluster.guard():  # a broken group ends each rank with its error
        for i in range(samples):
            mx.random.seed(1000 + i + (7919 * cluster.rank if how == APART else 0))
            stats = Stats()
            steps = speculative_generate_step(
                PROMPT,
                model,
                Eagle3Drafter(head, READS, V),
                max_tokens=N_TOKENS,
                num_draft=2,
                adaptive=False,
                temp=1.0,
                stats=stats,
                planner=Agreed(adaptive=False, cluster=cluster),
            )
            reply = tuple(s.token for s in steps)
            counts[reply] = counts.get(reply, 0) + 1
            verified.append(len(stats.proposed_by_position))
    if cluster.lead:
        ok, stat, crit = chi_square_pvalue_ok(counts, exact_joint(whole, Sampler(temp=1.0).probs), samples)
        with open(out, "w") as f:
            json.dump({"ok": ok, "stat": stat, "crit": crit, "verified": [min(verified), max(verified)]}, f)


if __name__ == "__main__":
    if sys.argv[1] == "law":
        law(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        target, out, prompts, drafters, max_tokens, single = sys.argv[1:]
        main(target, out, json.loads(prompts), json.loads(drafters), int(max_tokens), single == "1")
