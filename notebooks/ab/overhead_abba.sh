#!/usr/bin/env bash
# (the checkouts: /work/base at 4e1f437 and /work/main, each with its own .venv)
while pgrep -f "bench serve" > /dev/null; do sleep 3; done
for side in base main main base; do
  echo "== $side $(date +%T)"
  (cd /work/$side && .venv/bin/mlx-spec bench run /work/main/notebooks/suites/overhead-ab.toml --out /work/main/notebooks/runs 2>&1 | grep -E "wrote")
done
echo "== done $(date +%T)"
