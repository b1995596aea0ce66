#!/usr/bin/env bash
# Call 8: test_gpu.py passed alone but failed after test_stages.py: torch's default capture stream
# lay on GPU 1 (the first capture's), so later captures for GPU 0 recorded there. Fixed: every
# capture takes a stream of its own device. Here: both files in one process, then every other
# test marked cuda.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
LOG=$OUT/log.txt
timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_stages.py tests/test_gpu.py > $OUT/tests.txt 2>&1
echo "== test_stages + test_gpu rc=$? at $SECONDS s: $(tail -1 $OUT/tests.txt | cut -c1-200)" | tee -a $LOG
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | cut -c1-200 | head -8 | tee -a $LOG
timeout $((570 - SECONDS)) python3 -m pytest -q -rfE -p no:cacheprovider -m cuda tests/ --ignore=tests/test_stages.py --ignore=tests/test_gpu.py > $OUT/tests-cuda.txt 2>&1
echo "== other cuda tests rc=$? at $SECONDS s: $(tail -1 $OUT/tests-cuda.txt | cut -c1-200)" | tee -a $LOG
grep -E "^(FAILED|ERROR)" $OUT/tests-cuda.txt | cut -c1-200 | head -8 | tee -a $LOG
