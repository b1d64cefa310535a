#!/usr/bin/env bash
# Run every experiment sweep into OUT/<experiment>, a new directory by default, so that a run
# (on a fresh clone too) computes every point instead of resuming the committed
# experiments/<name>/out. Pass the same OUT again to resume an interrupted run there.
# Usage: experiments/run_all.sh [WORKERS] [OUT]   (from the repository root)
#   WORKERS  local worker processes per sweep (default 2)
#   OUT      output root (default: a new directory made by mktemp -d, printed first and last)
set -euo pipefail
workers="${1:-2}"
out="${2:-$(mktemp -d "${TMPDIR:-/tmp}/parosim-experiments.XXXXXX")}"
echo "== output: $out"
for spec in experiments/[0-9]*/sweep.yaml; do
  dir="$(dirname "$spec")"
  echo "== $dir -> $out/$(basename "$dir")"
  python -m parosim.sweep "$spec" --out "$out/$(basename "$dir")" --workers "$workers" \
    --no-progress
done
echo "== results under $out"
