#!/usr/bin/env bash
# Run each GPU test of some test paths in its own process under its own time limit, so a test that
# hangs (a kernel deadlock) or compiles for minutes is named, and the others still run.
# Usage: bash benchmarks/gpu_tests_one_by_one.sh OUT_MD PER_TEST_SECONDS TOTAL_SECONDS PATH... [-- PYTEST_ARGS]
# Writes a markdown table (test, result: passed / FAILED / TIMEOUT / skipped, seconds) to OUT_MD.
set -uo pipefail
out=$1 per=$2 total=$3; shift 3
paths=(); extra=()
while (($#)); do [[ $1 == -- ]] && { shift; extra=("$@"); break; }; paths+=("$1"); shift; done
start=$SECONDS
printf '| test | result | s |\n| --- | --- | ---: |\n' > "$out"
mapfile -t ids < <(python3 -m pytest -q --collect-only -m gpu -p no:cacheprovider "${paths[@]}" "${extra[@]}" 2>/dev/null \
  | grep '::')
for id in "${ids[@]}"; do
  left=$((total - (SECONDS - start)))
  if ((left < 10)); then printf '| `%s` | not run (session time) | |\n' "$id" >> "$out"; continue; fi
  limit=$((per < left ? per : left)); t0=$SECONDS
  log=$(timeout "$limit" python3 -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning "$id" "${extra[@]}" 2>&1)
  rc=$?
  case $rc in
    0) result=$(grep -q ' skipped' <<<"$log" && echo skipped || echo passed) ;;
    124|137) result="TIMEOUT after ${limit} s" ;;
    *) result="FAILED: $(grep -m1 -E '^E ' <<<"$log" | cut -c1-160 | tr '|' '/')" ;;
  esac
  printf '| `%s` | %s | %d |\n' "$id" "$result" $((SECONDS - t0)) | tee -a "$out"
done
