#!/usr/bin/env bash
# The broker demo (issue 68): start a single-node KRaft Kafka cluster per region (jvm/lib/kafka-broker),
# produce a simulated store's raw Venice records into them (zstd with a dictionary, chunked values, push
# control messages), dump them with `replica-lens dump-kafka` (the cut in <landing>/<snapshot>/_cut.json),
# audit the snapshot, and stop the brokers. Options: --regions N --keys N --writes N --snapshot-id ID
# --landing DIR --warehouse DIR. The README's main demo (scripts/demo.sh) stays the embedded one.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if ! ls jvm/lib/kafka-broker/kafka_2.13-*.jar >/dev/null 2>&1 || ! ls jvm/lib/kafka-source/*.jar >/dev/null 2>&1; then
  echo "kafka-demo: the Kafka jars are missing (jvm/lib/kafka-broker, jvm/lib/kafka-source): ./scripts/setup-jvm.sh resolves them with Maven" >&2
  exit 2
fi
exec .venv/bin/python -m replica_lens.brokers "$@"
