#!/usr/bin/env bash
# Resolve the pinned JVM parts of jvm/pom.xml into jvm/lib/ (gitignored) with Maven:
#   jvm/lib/delta         Delta Lake's Spark writer (REPLICA_LENS_DELTA_JARS defaults to it)
#   jvm/lib/kafka-source  Spark's Kafka source (REPLICA_LENS_KAFKA_JARS defaults to it)
#   jvm/lib/kafka-broker  a Kafka broker, KRaft mode, for the tests and scripts/kafka-demo.sh
# Only the jars Spark does not ship are copied into the first two (the rest would shadow or
# duplicate Spark's own). Maven's cache (~/.m2) makes a second run cost a few seconds.
# Without Maven, or where Maven Central refuses an artifact, the project still runs: the
# embedded Delta engine (delta-rs) needs no jar, and the tests that need a jar say so and skip.
set -euo pipefail
cd "$(dirname "$0")/../jvm"

if ! command -v mvn >/dev/null 2>&1; then
  echo "setup-jvm: no Maven (mvn) on PATH: the JVM parts are left out (apt-get install maven adds them)" >&2
  exit 0
fi

resolve() {  # profile, copy-dependencies filter
  local profile="$1" filter="$2" out="lib/$1" stamp="lib/$1/.resolved"
  if [ -f "$stamp" ] && [ "$stamp" -nt pom.xml ]; then return 0; fi
  rm -rf "$out.tmp"
  if mvn -q -B -P "$profile" dependency:copy-dependencies -DincludeScope=runtime $filter \
      -DoutputDirectory="$out.tmp" >"lib-$profile.log" 2>&1; then
    rm -rf "$out" && mv "$out.tmp" "$out" && touch "$stamp" && rm -f "lib-$profile.log"
  else
    rm -rf "$out.tmp"
    echo "setup-jvm: Maven could not resolve profile $profile (jvm/lib-$profile.log); it is left out" >&2
  fi
}

mkdir -p lib
resolve delta "-DincludeGroupIds=io.delta,io.unitycatalog,com.fasterxml.jackson.datatype,javax.annotation"
resolve kafka-source "-DincludeArtifactIds=spark-sql-kafka-0-10_2.13,spark-token-provider-kafka-0-10_2.13,kafka-clients,commons-pool2"
resolve kafka-broker ""
echo "setup-jvm: $(ls lib | tr '\n' ' ')in jvm/lib"
