#!/usr/bin/env bash
# Set up (or update) the project's virtual environment in .venv from PyPI, and the pinned JVM parts
# (jvm/pom.xml: Delta's Spark writer, Spark's Kafka source, a Kafka broker) from Maven Central into
# jvm/lib/ (scripts/setup-jvm.sh). Needs Python 3.11 and a Java 17 runtime (for Spark); Maven for
# the JVM parts. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

python_bin="${PYTHON:-}"
if [ -z "$python_bin" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then python_bin="$candidate"; break; fi
  done
fi
if [ -z "$python_bin" ] || ! "$python_bin" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "setup: Python 3.11 is needed (set PYTHON=/path/to/python3.11)" >&2
  exit 2
fi
if ! command -v java >/dev/null 2>&1; then
  echo "setup: a Java 17 runtime is needed for Spark (apt-get install openjdk-17-jre-headless)" >&2
  exit 2
fi

if [ ! -x .venv/bin/python ]; then
  "$python_bin" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# The versions of constraints.txt, the tested set (scripts/update-constraints.sh upgrades them).
.venv/bin/python -m pip install --quiet -e ".[test]" --constraint constraints.txt
# An editable install leaves the project's modules uncompiled (pip compiles only what it copies).
# Where PYTHONDONTWRITEBYTECODE is set (common in containers) every command would compile them
# from source again at every start (docs/performance.md). Compile them once here.
.venv/bin/python -m compileall -q assets pipelines explain resources schemas replica_lens
./scripts/setup-jvm.sh
echo "setup: .venv ready ($(.venv/bin/python --version), $(java -version 2>&1 | head -n 1))"
