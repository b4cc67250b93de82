"""Every constant of the generating layer that is not measured at run time, one line each with its reason.

Costs (a target pass by size, a draft step, a catch-up, the host's share of a round) are never constants: the
planner times them on the machine in use (`planner.py`). What is left are statistical choices, limits and
defaults from the papers and peers named beside them.
"""

# The engine
DEFAULT_MAX_TOKENS = 256  # mlx-lm's generate default
PREFILL_STEP = 512  # prompt tokens per forward pass: bounds attention scratch memory (mlx-lm's speculative prefill)
SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # the verify sizes a round may run at: few shapes, so each is built once

# The planner (statistics of measured timings and acceptance)
EMA = 0.3  # weight of the newest round in a draft model's cost fit: follows a change within a few rounds
TIMINGS = 9  # a verify size's cost is the median of its latest 9 rounds: 4 stalls in a row move it by nothing
PRIOR_ACCEPT = 0.6  # acceptance assumed before any measurement: optimistic, so every source gets tried
PRIOR_TRIALS = 2.0  # ... worth this many judged draft tokens: two rounds of evidence outweigh it
DISCOUNT = 0.8  # per round, the weight of older acceptance counts: the estimate follows the last ~5 rounds
MARGIN = 0.05  # requests share a pass where it costs 5 % less than their passes alone: below that, timing noise decides
PROBE_BUDGET = 0.02  # a passed-over costly source earns this share of each round's time towards its next probe
CATCH_UP_RATIO = 24  # a draft model's step costs ~24 of its catch-up tokens until measured: a prefill runs its tokens
# in one pass, decoding is bound by reading the weights once a token (prefill runs 20-100x decode's tokens/s)
CATCH_UP_HORIZON = 32  # output tokens a draft model's catch-up is spread over: about two of its drafts

# Drafters
MODEL_K = 15  # most tokens a draft model (or self draft) drafts in a round: 16 positions, a verify size
NGRAM_N = 5  # ANPD (Ou et al. 2024) Figs 4-5: multi-level gains stop growing beyond N = 5
NGRAM_K = 7  # ANPD Fig 3: the speed-up plateaus for K in 6..8
NGRAM_MIN_N = 2  # ANPD Alg 2 falls back down to bigrams
NGRAM_MIN_TRUST = 0.2  # an n-gram level accepted less often than this stops its chain (our addition to ANPD)
NGRAM_TRUST_EMA = 0.2  # weight of the newest outcome in a level's acceptance estimate
NGRAM_TRUST_RECOVERY = 0.02  # an untrusted level regains this much per new context, so it is retried now and then
SUFFIX_K = 24  # most tokens a long suffix match drafts (SuffixDecoding drafts up to 16-32)
SUFFIX_ALPHA = 2.0  # draft at most alpha x the match length (SuffixDecoding's max_spec = alpha * match length)
SUFFIX_MIN_MATCH = 2  # a shorter match is a coincidence, not a copy
SUFFIX_MIN_SCORE = 0.1  # stop where the product of the continuation's empirical probabilities falls below this
HINDSIGHT_MIN = 4  # output tokens a draft model's catch-up must feed for it to judge them (`Draft.hindsight`)
HINDSIGHT_MAX = 128  # ... and the most it judges: the last ones
QUANT_SELF_FORMAT = "int4"  # QSpec's draft precision
QUANT_SELF_GROUP = 64  # its affine group size: MLX's default (the FP modes fix their own)
IMPORTANCE_TOKENS = 32  # prompt tokens self:importance ranks blocks on: about one multi-token pass of the target
NGRAM_SYNC_TAIL = 8  # indexed tail tokens the n-gram table re-checks per call to notice a rewritten context in O(1)
SUFFIX_COUNT_WALK = 64  # suffix-link steps per token spent on occurrence counts: bounds a repetitive text's cost
SUFFIX_MEMORY_TOKENS = 200_000  # tokens `suffix:shared` keeps (about 100 MB of automaton); past it the older half goes
SUFFIX_MATCH_TAIL = 64  # context tokens matched against that memory each round (a longer match drafts no longer)

# Learned drafters
TREE_WIDTH = 4  # a draft tree's depth feeds its 4 likeliest nodes, each drafting its 4 likeliest children (EAGLE-2's
# top-k, 10 on a GPU)
TREE_PER_DEPTH = (
    3  # a tree k deep verifies about 3 k tokens: on this CPU 7 tokens 2 deep beat 11 or 15 (notebooks/NOTEBOOK.md §35)
)
EAGLE_HELD_CHUNKS = 32  # the target's states a head holds, not fed yet, are joined into one array past this many
