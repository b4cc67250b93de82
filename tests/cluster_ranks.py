"""What each rank runs in the cluster tests (`mlx.launch -n 2 --backend ring -- python tests/cluster_ranks.py ...`):
the tiny target sharded over the group, greedy replies by every drafter asked for; rank 0 writes them as JSON."""

import json
import sys

from mlx_spec.cluster import Agreed, Cluster
from mlx_spec.gen.load import load_folder
from mlx_spec.gen.stream import generate
from mlx_spec.named import make_drafter

# A run is a drafter spec, "@unlike": the followers' own planners would plan otherwise (adaptive; rank 0's is not),
# "@sampled": at temperature 0.8 with a seed (a seeded row samples by the Gumbel-max rule: the same tokens as plain).
UNLIKE, SAMPLED = "unlike", "sampled"


def main(target: str, out: str, prompts: list[str], drafters: list[str], max_tokens: int, single: bool):
    """{run: [tokens per prompt]} and {run: [proposed, accepted]}; plain on one machine too where `single`."""
    cluster = Cluster.join("tensor")
    model, tok = cluster.load(target)
    cluster.agree_seed(None)  # as the CLI does
    replies, accepted = {}, {}
    with cluster.guard():
        for run in drafters:
            spec, _, mode = run.partition("@")
            drafter = make_drafter(spec, model, tok) if spec != "none" else None
            adaptive = mode == UNLIKE and not cluster.lead
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
                    planner=Agreed(adaptive=adaptive, cluster=cluster),
                    **sampling,
                )
                for p in prompts
            ]
            replies[run] = [r.tokens for r in outs]
            accepted[run] = [sum(r.stats.proposed for r in outs), sum(r.stats.accepted for r in outs)]
    if single and cluster.lead:
        alone = load_folder(target)[0]
        replies["one machine"] = [
            generate(alone, tok, p, max_tokens=max_tokens, eos_token_ids=()).tokens for p in prompts
        ]
    if cluster.lead:
        with open(out, "w") as f:
            json.dump({"replies": replies, "accepted": accepted}, f)


if __name__ == "__main__":
    target, out, prompts, drafters, max_tokens, single = sys.argv[1:]
    main(target, out, json.loads(prompts), json.loads(drafters), int(max_tokens), single == "1")
