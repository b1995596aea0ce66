# Shared by benchmarks/gpu/*.sh (sourced): the bench pair made once per machine, and the CUDA tests.
# bench_pair: the bench pair into /tmp/bench unless a call on this machine made it already
# (trained MINUTES minutes, default 1; log in /tmp/pair.log).
# Scripts run side by side (one per GPU) share it: the first makes it, the others wait on the lock.
bench_pair() {
  (flock 9
   [ -f /tmp/bench/pair.toml ] || PYTHONPATH=$PWD/src timeout 200 python3 benchmarks/make_pair.py --preset bench \
     --seed 0 --out /tmp/bench --minutes "${MINUTES:-1}" --device cuda > /tmp/pair.log 2>&1) 9> /tmp/bench.lock
}
# gpu_tests WORKERS FILES: pytest over FILES (one string; TESTS overrides it) within TEST_LIMIT
# seconds (default 150), outcomes in $OUT/tests.txt, failures in $LOG.
gpu_tests() {
  local par="" files=${TESTS:-$2}
  if python3 -c "import xdist" 2>/dev/null; then par="-n $1 --dist loadfile"; fi
  # shellcheck disable=SC2086
  timeout "${TEST_LIMIT:-150}" python3 -m pytest -q -p no:cacheprovider -p no:benchmark -rfE --tb=short $par \
    $files > "$OUT/tests.txt" 2>&1
  echo "== tests rc=$? at $SECONDS s: $(tail -1 "$OUT/tests.txt")" | tee -a "$LOG"
  grep -E "^FAILED|^ERROR" "$OUT/tests.txt" | head -20 | tee -a "$LOG"
}
