#!/usr/bin/env bash
# (/tmp/pre: `git worktree add /tmp/pre 92ed928`)
# The overhead suite, 92ed928 (before the probe's measured pay) against the working tree, ABBA.
for side in pre main main pre pre main; do
  echo "== $side $(date +%T)"
  if [ $side = pre ]; then d=/tmp/pre; else d=/work/main; fi
  (cd $d && PYTHONPATH=$d /work/main/.venv/bin/mlx-spec bench run /work/main/notebooks/suites/overhead-ab.toml --out /work/main/notebooks/runs 2>&1 | grep -E "wrote")
done
echo "== done $(date +%T)"
