#!/usr/bin/env bash
# (the checkouts: /work/base at 4e1f437 and /work/main, each with its own .venv)
# bench serve, before (4e1f437, /work/base) and after (/work/main), each client count on both, alternating which goes first.
set -u
OUT=/work/main/notebooks/runs
REPEATS=${REPEATS:-3}
i=0
for c in ${CLIENTS:-1 4 8 16}; do
  if [ $((i % 2)) -eq 0 ]; then order="base main"; else order="main base"; fi
  for side in $order; do
    echo "== $side clients=$c $(date +%T)"
    (cd /work/$side && .venv/bin/mlx-spec bench serve --model qwen2.5-coder-0.5b --draft suffix --clients $c --max-tokens 32 --repeats $REPEATS --out $OUT 2>&1 | grep -v "^\[mlx-spec\]" | tail -12)
  done
  i=$((i+1))
done
