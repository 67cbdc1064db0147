#!/usr/bin/env bash
# Train a drafter, or capture hidden states, over several nodes; run the same command on every node.
#   NODE_RANK=0 NUM_NODES=2 GPUS_PER_NODE=8 MASTER_ADDR=host0 scripts/launch_multi_node.sh RECIPE.yaml [key=value ...]
#   NODE_RANK=0 ... scripts/launch_multi_node.sh capture RECIPE.yaml --target T --dataset D --out O [key=value ...]
# Every node must see the same recipe, target, dataset (or capture cache) and out_dir (a shared filesystem); the
# processes check it before any work. A target split with target.parallel=tp keeps each TP group on one node
# (tp_size <= GPUS_PER_NODE); target.parallel=fsdp with target.fsdp_size=GPUS_PER_NODE shards within a node.
set -euo pipefail
# the accelerate templates: configs/ beside this script installed (draftsmith/configs), ../configs in a checkout
configs="$(dirname "$0")/configs"; [ -d "$configs" ] || configs="$(dirname "$0")/../configs"
command=(train); [ "${1:-}" = capture ] && { command=(data capture); shift; }
recipe=${1:?usage: $0 [capture] RECIPE.yaml [key=value ...]}; shift
: "${NODE_RANK:?set NODE_RANK (0 on the main node)}" "${MASTER_ADDR:?set MASTER_ADDR (the main node)}"
nodes=${NUM_NODES:-2}; per_node=${GPUS_PER_NODE:-8}
exec accelerate launch --config_file "$configs/accelerate/multi_node.yaml" \
  --num_machines "$nodes" --num_processes $((nodes * per_node)) --machine_rank "$NODE_RANK" \
  --main_process_ip "$MASTER_ADDR" --main_process_port "${MASTER_PORT:-29500}" \
  -m draftsmith "${command[@]}" --config "$recipe" "$@"
