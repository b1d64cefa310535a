#!/usr/bin/env bash
# Run every experiment sweep into experiments/<name>/out (resumable: rerun to continue).
# Usage: experiments/run_all.sh [WORKERS]   (from the repository root)
set -euo pipefail
workers="${1:-2}"
for spec in experiments/0*/sweep.yaml; do
  dir="$(dirname "$spec")"
  echo "== $dir"
  python -m parosim.sweep "$spec" --out "$dir/out" --workers "$workers" --no-progress
done
