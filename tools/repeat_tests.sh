#!/usr/bin/env bash
# Runs the same tests REPEAT times and counts, per test, how often each outcome came:
# a test that fails once in 20 runs is a failing test (make test-repeat).
#
#   tools/repeat_tests.sh 20 .venv/bin/python tests/test_faults.py -k disk_full
set -u
repeat=$1 python=$2
shift 2
logs=$(mktemp -d)
for run in $(seq "$repeat"); do
  "$python" -m pytest -q -p no:cacheprovider -rA "$@" >"$logs/run$run.txt" 2>&1
  echo "run $run/$repeat: $(tail -n 1 "$logs/run$run.txt")"
done
echo "outcomes over $repeat runs (logs in $logs):"
grep -hE '^(PASSED|FAILED|ERROR) ' "$logs"/run*.txt | awk '{print $1, $2}' | sort | uniq -c
! grep -qhE '^(FAILED|ERROR) ' "$logs"/run*.txt
