"""Write an EAGLE-3 head of random weights for a target folder (its layer shape, the default blocks read, a random
draft vocabulary of 32k ids, no embedding of its own): what a head costs when its drafts are never accepted.

    python notebooks/ab/random_head.py ~/.cache/mlx-spec/models/qwen2.5-coder-1.5b /tmp/heads/random-1.5b
"""
import json
import sys
from pathlib import Path

import mlx.core as mx

from mlx_spec.make import eagle3

target, out = Path(sys.argv[1]).expanduser(), Path(sys.argv[2])
c = json.loads((target / "config.json").read_text())
layer = {k: c[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                           "rms_norm_eps", "rope_theta", "max_position_embeddings") if k in c}
config = eagle3.Eagle3Config(dict(layer, model_type="llama"), c["vocab_size"], 32000, c["hidden_size"],
                             eagle3.default_reads(c["num_hidden_layers"]))
mx.random.seed(0)
head = eagle3.Eagle3Head(config)
head.pop("embed_tokens")  # the target's is used
ids = mx.sort(mx.random.permutation(c["vocab_size"])[:32000]).astype(mx.int32)
head.d2t = ids - mx.arange(32000, dtype=mx.int32)
eagle3.save(head, out, force=True, provenance={"source": "random", "operations": [{"op": "random", "seed": 0}]})
print(out)
