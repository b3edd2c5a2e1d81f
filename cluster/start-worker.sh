#!/usr/bin/env bash
# Join this machine (its CPUs and GPUs) to a Habu Ray pool.
#   cluster/start-worker.sh HEAD_IP:PORT            join
#   cluster/start-worker.sh HEAD_IP:PORT --dry-run  print the command only
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=cluster/config.env
source "$here/config.env"

if [[ $# -lt 1 || "$1" == -* ]]; then
    echo "usage: $0 HEAD_IP:PORT [--dry-run]   (the address start-head.sh printed)" >&2
    exit 2
fi
address="$1"
args=(ray start --address="$address"
      --min-worker-port="$HABU_RAY_MIN_WORKER_PORT"
      --max-worker-port="$HABU_RAY_MAX_WORKER_PORT"
      --object-store-memory="$HABU_RAY_OBJECT_STORE_BYTES")
[[ -n "$HABU_RAY_NUM_CPUS" ]] && args+=(--num-cpus="$HABU_RAY_NUM_CPUS")
[[ -n "$HABU_RAY_NUM_GPUS" ]] && args+=(--num-gpus="$HABU_RAY_NUM_GPUS")

if [[ "${2:-}" == "--dry-run" ]]; then
    echo "${args[*]}"
    exit 0
fi
if ! python -c "import habu" 2>/dev/null; then
    echo "habu is not installed here: pip install $HABU_PIP_SPEC (the same version as the driver)" >&2
    exit 1
fi
"${args[@]}"
