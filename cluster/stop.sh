#!/usr/bin/env bash
# Leave the pool (on a worker) or shut it down (on the head).
set -euo pipefail
ray stop
