#!/usr/bin/env bash
# Train a drafter on every GPU of this node.
#   scripts/launch_multi_gpu.sh configs/smollm2-135m/eagle3.yaml [key=value ...]
# NUM_GPUS (default: all visible) and STRATEGY (ddp | deepspeed | fsdp, default: the recipe's) may be set.
set -euo pipefail
# the accelerate templates: configs/ beside this script installed (draftsmith/configs), ../configs in a checkout
configs="$(dirname "$0")/configs"; [ -d "$configs" ] || configs="$(dirname "$0")/../configs"
recipe=${1:?usage: $0 RECIPE.yaml [key=value ...]}; shift
gpus=${NUM_GPUS:-$(python -c 'import torch; print(torch.cuda.device_count())')}
extra=(); [ -n "${STRATEGY:-}" ] && extra+=("distributed.strategy=$STRATEGY")
exec accelerate launch --config_file "$configs/accelerate/single_node.yaml" \
  --num_processes "$gpus" -m draftsmith train --config "$recipe" "${extra[@]}" "$@"
