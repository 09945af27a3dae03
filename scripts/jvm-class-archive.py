"""Build a class-data-sharing archive of the classes a Spark JVM of this project loads (jvm/cds/, gitignored).

Every JVM that PySpark starts reads, verifies and links some 17,000 classes from Spark's jars before its first query.
A static CDS archive (JDK 17, ``-Xshare:dump``) holds them parsed and verified: a JVM given
``-XX:SharedArchiveFile=jvm/cds/spark.jsa`` maps them instead. The test suite gives it to every Spark JVM it starts
(tests/conftest.py), since it starts some thirty of them; nothing else uses it. ./scripts/test.sh runs this first.

Steps: a small snapshot (``replica-lens simulate``'s default) is audited in a new process whose JVM lists every class
it loads (``-XX:DumpLoadedClassList``) and reports its class path, then ``java -Xshare:dump`` archives those classes
for that class path. A JVM whose class path differs (other jars, another order) ignores the archive silently and
runs as without it (the suite checks that its own JVM maps it: tests/test_definitions.py). ``jvm/cds/spark.json``
records what the archive was built for (the Java runtime, Spark's jars); the script rebuilds it only when that
changed. About a minute, 200 MB.

    .venv/bin/python scripts/jvm-class-archive.py [--force]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
FOLDER = PROJECT / "jvm" / "cds"
ARCHIVE = FOLDER / "spark.jsa"
RECORD = FOLDER / "spark.json"

# Run in the new process: audit the simulated snapshot, print the JVM's class path (the launcher expands the jars'
# wildcard into it: the archive must be dumped for that exact list).
AUDIT = """
import json, sys
from resources.session import build_spark_session
from replica_lens.audit import run_audit
spark = build_spark_session(master="local[2]", shuffle_partitions=4)
class_path = spark._jvm.java.lang.System.getProperty("java.class.path")
result = run_audit("s1", sys.argv[1], sys.argv[2], spark_master="local[2]", delta_jars_dir=None, shuffle_partitions=4)
print("CLASS_PATH " + json.dumps({"class_path": class_path, "success": bool(result.success)}))
"""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    java = Path(home) / "bin" / "java" if home else None
    return str(java) if java and java.exists() else (shutil.which("java") or "java")


def built_for() -> dict:
    """What an archive is valid for: the Java runtime and Spark's jars (names and sizes)."""
    version = subprocess.run([java_binary(), "-version"], capture_output=True, text=True).stderr.strip()
    jars = sorted((p.name, p.stat().st_size) for p in (spark_home() / "jars").glob("*.jar"))
    digest = hashlib.sha256(json.dumps(jars).encode()).hexdigest()
    return {"java": version, "spark_jars": digest}


def current() -> bool:
    if not (ARCHIVE.is_file() and RECORD.is_file()):
        return False
    try:
        record = json.loads(RECORD.read_text())
    except ValueError:
        return False
    return {k: record.get(k) for k in ("java", "spark_jars")} == built_for()


def build() -> dict:
    FOLDER.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cds-") as tmp:
        work = Path(tmp)
        cli = [sys.executable, "-m", "replica_lens.cli"]
        env = {k: v for k, v in os.environ.items() if k not in ("REPLICA_LENS_DELTA_JARS", "REPLICA_LENS_DELTA_ENGINE")}
        env["PYTHONPATH"] = str(PROJECT)
        subprocess.run([*cli, "simulate", "--out", str(work / "landing"), "--snapshot-id", "s1"], check=True,
                       env=env, cwd=PROJECT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        class_list = work / "classes.lst"
        env["SPARK_SUBMIT_OPTS"] = f"{env.get('SPARK_SUBMIT_OPTS', '')} -XX:DumpLoadedClassList={class_list}".strip()
        audited = subprocess.run([sys.executable, "-c", AUDIT, str(work / "landing"), str(work / "warehouse")],
                                 env=env, cwd=PROJECT, capture_output=True, text=True)
        lines = [line for line in audited.stdout.splitlines() if line.startswith("CLASS_PATH ")]
        if audited.returncode != 0 or not lines:
            raise SystemExit(f"jvm-class-archive: the audit that lists the classes failed:\n{audited.stderr[-3000:]}")
        found = json.loads(lines[-1].split(" ", 1)[1])
        if not found["success"]:
            raise SystemExit("jvm-class-archive: the audit that lists the classes did not succeed")
        partial = ARCHIVE.with_suffix(".jsa.tmp")
        partial.unlink(missing_ok=True)
        # Classes the archive cannot hold (signed jars, failed verification) are listed as warnings: kept in a log.
        with open(FOLDER / "dump.log", "w", encoding="utf-8") as log:
            subprocess.run([java_binary(), "-Xshare:dump", f"-XX:SharedClassListFile={class_list}",
                            f"-XX:SharedArchiveFile={partial}", "-cp", found["class_path"]],
                           check=True, stdout=log, stderr=subprocess.STDOUT)
        classes = sum(1 for line in class_list.read_text().splitlines() if line and not line.startswith("#"))
    os.replace(partial, ARCHIVE)
    record = {**built_for(), "class_path": found["class_path"], "classes_listed": classes}
    RECORD.write_text(json.dumps(record, indent=1))
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when the archive is current")
    args = parser.parse_args()
    if not args.force and current():
        print(f"jvm-class-archive: {ARCHIVE.relative_to(PROJECT)} is current")
        return
    record = build()
    size = ARCHIVE.stat().st_size / 2**20
    print(f"jvm-class-archive: {record['classes_listed']} classes listed, {ARCHIVE.relative_to(PROJECT)} "
          f"({size:.0f} MB)")


if __name__ == "__main__":
    main()
