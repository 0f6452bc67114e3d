#!/usr/bin/env bash
# `make run`: start DESIGN.md's local cluster (3 brokers, 2 controllers, 1 group coordinator, 1 gateway),
# write 100,000 x 1 KiB records through the idempotent producer with acks=all to a topic with RF 3 and
# min.insync.replicas=2, read them back in a consumer group, and show where things stand.
set -euo pipefail
DATA_DIR=${DATA_DIR:-.gregor}
GREGOR=${GREGOR:-.venv/bin/gregor}
RECORDS=${RECORDS:-100000}
RECORD_SIZE=${RECORD_SIZE:-1024}
TOPIC=${TOPIC:-demo}
GROUP=${GROUP:-demo-group}

if [ -f "$DATA_DIR/cluster.json" ]; then "$GREGOR" cluster down --data-dir "$DATA_DIR" >/dev/null 2>&1 || true; fi
echo "== starting a local cluster in $DATA_DIR (3 brokers, 2 controllers, 1 group coordinator, 1 gateway)"
"$GREGOR" cluster up --data-dir "$DATA_DIR" >/dev/null
trap '"$GREGOR" cluster down --data-dir "$DATA_DIR" >/dev/null' EXIT
export GREGOR_DATA_DIR="$DATA_DIR"
"$GREGOR" cluster describe
"$GREGOR" topics delete "$TOPIC" >/dev/null 2>&1 || true
"$GREGOR" topics create "$TOPIC" --partitions 3 --replication-factor 3 --config min.insync.replicas=2

echo "== producing $RECORDS records of $RECORD_SIZE bytes (idempotent producer, acks=all)"
"$GREGOR" perf produce --topic "$TOPIC" --num-records "$RECORDS" --record-size "$RECORD_SIZE" \
    --throughput -1 --producer-props acks=all enable.idempotence=true linger.ms=5 batch.size=262144 \
    compression.type=none

echo "== consuming them back in consumer group $GROUP"
"$GREGOR" perf consume --topic "$TOPIC" --messages "$RECORDS" --group "$GROUP"

echo "== topics describe $TOPIC"
"$GREGOR" topics describe "$TOPIC"
echo "== groups describe $GROUP"
"$GREGOR" groups describe "$GROUP"

echo "== metrics (Prometheus text format) of every process"
"$(dirname "$GREGOR")/python" - "$DATA_DIR/cluster.json" <<'PY'
import json, sys
for p in json.load(open(sys.argv[1]))["processes"]:
    if p.get("metrics"):
        print(f"{p['role']:<12} {p['id']:>3}  {p['metrics']}")
PY
echo "== the same topic through Kafka's protocol: librdkafka (confluent-kafka) reads it from the Kafka listener"
"$(dirname "$GREGOR")/python" - "$DATA_DIR/cluster.json" "$TOPIC" "$RECORDS" <<'PY'
import json, sys, time
from confluent_kafka import Consumer
bootstrap, topic, want = json.load(open(sys.argv[1]))["kafka_bootstrap"], sys.argv[2], int(sys.argv[3])
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo-librdkafka", "auto.offset.reset": "earliest",
              "enable.auto.commit": False})
c.subscribe([topic])
seen, deadline = 0, time.monotonic() + 120
while seen < want and time.monotonic() < deadline:
    seen += sum(1 for m in c.consume(10000, 1.0) if m.error() is None)
c.close()
print(f"librdkafka read {seen} of {want} records from {bootstrap}")
sys.exit(0 if seen == want else 1)
PY
echo "demo done; the cluster is stopped on exit (logs in $DATA_DIR/logs)"
