#!/usr/bin/env bash
# `make run`: start a local cluster, produce 100,000 records, consume them back, print throughput.
set -euo pipefail
DATA_DIR=${DATA_DIR:-.gregor}
GREGOR=${GREGOR:-.venv/bin/gregor}
RECORDS=${RECORDS:-100000}
RECORD_SIZE=${RECORD_SIZE:-1024}
TOPIC=${TOPIC:-demo}

if [ -f "$DATA_DIR/cluster.json" ]; then "$GREGOR" cluster down --data-dir "$DATA_DIR" >/dev/null 2>&1 || true; fi
echo "== starting a local cluster in $DATA_DIR"
"$GREGOR" cluster up --data-dir "$DATA_DIR" --brokers 1 --controllers 0 >/dev/null
trap '"$GREGOR" cluster down --data-dir "$DATA_DIR" >/dev/null' EXIT
export GREGOR_DATA_DIR="$DATA_DIR"
"$GREGOR" cluster describe
"$GREGOR" topics delete "$TOPIC" >/dev/null 2>&1 || true
"$GREGOR" topics create "$TOPIC" --partitions 3 --replication-factor 1
"$GREGOR" topics describe "$TOPIC"

echo "== producing $RECORDS records of $RECORD_SIZE bytes (acks=1)"
"$GREGOR" perf produce --topic "$TOPIC" --num-records "$RECORDS" --record-size "$RECORD_SIZE" \
    --throughput -1 --producer-props acks=1 linger.ms=5 batch.size=262144 compression.type=none

echo "== consuming them back"
"$GREGOR" perf consume --topic "$TOPIC" --messages "$RECORDS"

echo "== a few records through the console tools"
printf 'k1:hello\nk2:gregor\n' | "$GREGOR" produce "$TOPIC" --property parse.key=true --property key.separator=: --partition 0
"$GREGOR" consume "$TOPIC" --partition 0 --offset earliest --max-messages 2 --timeout-ms 5000 --property print.key=true >/dev/null
echo "demo done; the cluster is stopped on exit (logs in $DATA_DIR/logs)"
