#!/usr/bin/env bash
# What ran on the device machine on 2026-11-28 (notebooks/NOTEBOOK.md §40): issue 46's agent suites and issue 45's
# planner ablation on the real Qwen2.5-Coder 0.5B (MLX int4, group 64, made here by
# `mlx-spec convert ~/.cache/mlx-spec/models/qwen2.5-coder-0.5b OUT --dtype bfloat16 -q int4`), on MLX's CUDA backend.
# The parts (../shared/gpu/pack.sh's layout: p0, p1, and the model split into 7 parts of 55 MB) came in the calls
# before this one; this call brings the last. Each suite has its own time limit so one that runs long leaves the
# others their time; a suite stopped at its limit keeps what it measured (records are written as they go).
set -u
mkdir -p /tmp/parts; cp -r .gpu/*/ /tmp/parts/ 2>/dev/null
source /tmp/parts/p0/unpack.sh
export MLX_SPEC_HOME=/tmp/msh; mkdir -p $MLX_SPEC_HOME; ln -sfn /tmp/models $MLX_SPEC_HOME/models
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ls /tmp/models
for s in mlx_spec/bench/suites/agent-long.toml notebooks/suites/gpu-agent.toml notebooks/suites/gpu-ablation.toml; do
  case $s in *agent-long*) t=170;; *gpu-agent*) t=190;; *) t=150;; esac
  echo "== $s (limit ${t}s) $(date +%T)"
  timeout $t mlx-spec bench run $s --out $OUT 2>&1 | grep -v "^\s*$" | tail -25
done
echo "== done $(date +%T)"
