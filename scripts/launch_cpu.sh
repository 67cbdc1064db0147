#!/usr/bin/env bash
# Train a drafter with N CPU processes over gloo: DDP, or DeepSpeed when the overrides say
# distributed.strategy=deepspeed.
#   NPROC=2 scripts/launch_cpu.sh configs/debug/tiny.yaml [key=value ...]
# `accelerate launch --cpu` would silently start one process: --multi_gpu with ACCELERATE_USE_CPU is the way
# for DDP; accelerate ignores DeepSpeed under ACCELERATE_USE_CPU, and without CUDA it runs DeepSpeed on CPU.
set -euo pipefail
recipe=${1:?usage: $0 RECIPE.yaml [key=value ...]}; shift
use_cpu=true
for arg in "$@"; do [ "$arg" = "distributed.strategy=deepspeed" ] && use_cpu=false; done
if [ "$use_cpu" = true ]; then export ACCELERATE_USE_CPU=true; fi
exec accelerate launch --multi_gpu --num_processes "${NPROC:-2}" --num_machines 1 \
  --mixed_precision no --dynamo_backend no -m draftsmith train --config "$recipe" device=cpu "$@"
