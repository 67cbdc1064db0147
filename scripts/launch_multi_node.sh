#!/usr/bin/env bash
# Train a drafter over several nodes; run the same command on every node.
#   NODE_RANK=0 NUM_NODES=2 GPUS_PER_NODE=8 MASTER_ADDR=host0 scripts/launch_multi_node.sh RECIPE.yaml [key=value ...]
# Every node must see the same recipe, dataset (or capture cache) and out_dir (a shared filesystem).
set -euo pipefail
recipe=${1:?usage: $0 RECIPE.yaml [key=value ...]}; shift
: "${NODE_RANK:?set NODE_RANK (0 on the main node)}" "${MASTER_ADDR:?set MASTER_ADDR (the main node)}"
nodes=${NUM_NODES:-2}; per_node=${GPUS_PER_NODE:-8}
exec accelerate launch --config_file "$(dirname "$0")/../configs/accelerate/multi_node.yaml" \
  --num_machines "$nodes" --num_processes $((nodes * per_node)) --machine_rank "$NODE_RANK" \
  --main_process_ip "$MASTER_ADDR" --main_process_port "${MASTER_PORT:-29500}" \
  -m scripts.cli train --config "$recipe" "$@"
