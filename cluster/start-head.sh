#!/usr/bin/env bash
# Start the head of a Habu Ray pool on this machine (it runs `habu search` too).
#   cluster/start-head.sh            start it
#   cluster/start-head.sh --dry-run  print the command only
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=cluster/config.env
source "$here/config.env"

args=(ray start --head
      --port="$HABU_RAY_PORT"
      --dashboard-port="$HABU_RAY_DASHBOARD_PORT"
      --min-worker-port="$HABU_RAY_MIN_WORKER_PORT"
      --max-worker-port="$HABU_RAY_MAX_WORKER_PORT"
      --object-store-memory="$HABU_RAY_OBJECT_STORE_BYTES")
[[ -n "$HABU_RAY_NUM_CPUS" ]] && args+=(--num-cpus="$HABU_RAY_NUM_CPUS")
[[ -n "$HABU_RAY_HEAD_NUM_GPUS" ]] && args+=(--num-gpus="$HABU_RAY_HEAD_NUM_GPUS")

if [[ "${1:-}" == "--dry-run" ]]; then
    echo "${args[*]}"
    exit 0
fi
"${args[@]}"
ip="$(hostname -I 2>/dev/null | awk '{print $1}')"
echo
echo "head is up. On each GPU machine:  cluster/start-worker.sh ${ip:-HEAD_IP}:$HABU_RAY_PORT"
echo "then, here:                        habu search examples/moe_gather.habu --budget 1h --ray auto"
