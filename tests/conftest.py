"""Shared fixtures: one Spark session for the whole suite (JVM start-up is paid once)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.examples import register_profiles

register_profiles()  # before pytest's Hypothesis plugin loads --hypothesis-profile (tests/examples.py)
os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)

# The test files that take longest, longest first (`pytest --junitxml`, test times summed per file, measured at
# 67379a3 on two workers). The README's command hands whole files to two workers in collection order
# (scripts/test.sh), so these go first and short files fill in at the end: no long file starts last and runs alone
# while the other worker is idle. Only the order changes; a file missing here runs after them. The files of a group
# (FILE_GROUPS below) run together, at the place of the group's first file.
LONGEST_FIRST = (
    "test_watch.py",
    "test_incremental.py",
    "test_reliability.py",
    "test_native_delta.py",
    "test_ui_browser.py",
    "test_venice_ingest.py",
    "test_cluster.py",
    "test_audit_e2e.py",
    "test_benchmark.py",
    "test_state_bounded.py",
    "test_leapfrog_properties.py",
    "test_venice_simulated.py",
    "test_stream_pass.py",
    "test_validation.py",
    "test_code_generation.py",
    "test_kafka_brokers.py",
    "test_ingest.py",
    "test_ingest_fuzz.py",
    "test_delta_store.py",
    "test_simulated_anomalies.py",
    "test_leapfrog.py",
    "test_definitions.py",
    "test_venice_fuzz_spark.py",
    "test_read_positions.py",
    "test_kafka_dump.py",
    "test_blocking_checks.py",
    "test_simulator.py",
    "test_arrow_checksum.py",
    "test_exporters.py",
    "test_explain_render.py",
    "test_anomalies.py",
)


# The JVMs the tests start in other processes (audit commands, writers killed mid-write, the
# cluster's daemons, the webserver's runs, the benchmark's process runs) live seconds over small
# snapshots: the optimizing JIT compiler (C2) costs them CPU it never pays back, on two cores shared
# with the other worker. They get the first tier only; the suite's own long-lived JVM (``spark``)
# keeps both. This changes no result, only how the JVM compiles the same bytecode. (Measured at e698bbc, 2 cores, one
# run each: the suite's own JVM with C1 only took the whole suite from 1175 s to 1554 s, the ingest fuzz test alone
# 351 s.) Why: with the first tier only, the JVM's code cache shrinks from 240 MiB to 48 MiB; late in a suite run it
# is full, the JIT stops and the fuzz test runs interpreted. Not kept either: the suite's own JVM with the first tier
# and a 256 MiB code cache (-XX:ReservedCodeCacheSize=256m). No cliff then (that test 32.8 s), but no gain: back to back
# at 8beeeb1, 881.2 s and 1657 CPU-seconds with it, 841.1 s and 1606 without (the first fixtures sped up, test_watch's
# 165 -> 146 s and test_incremental's 66 -> 45 s, the longer runs slowed down).
CHILD_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
# Not kept: the optimizing tier's thresholds raised tenfold for the suite's own JVM (-XX:Tier4InvocationThreshold=50000
# -XX:Tier4CompileThreshold=60000 -XX:Tier4BackEdgeThreshold=400000). A warm audit of `replica-lens simulate`'s default
# snapshot then spends 2.9 s of compiler threads' CPU instead of 7.2 s (the rest 5.5 s either way), but the whole
# suite, two new clones run back to back at cddd205 and f29648d, took the same: 908.7 s and 1748.6 CPU-seconds of the
# machine without, 917.0 s and 1742.3 with. (Not found: where the saving goes; the code waiting longer in the
# profiling tier is one guess.)
SUBMIT_OPTS = "SPARK_SUBMIT_OPTS"
# A standalone cluster's master and worker (tests/test_cluster.py) are JVMs the suite starts too: spark-class gives
# them SPARK_DAEMON_JAVA_OPTS, not SPARK_SUBMIT_OPTS. (That test alone, one run each at 081bc2d: 82.5 s -> 69.0 s;
# in whole suites the machine's noise is larger than that.)
DAEMON_OPTS = "SPARK_DAEMON_JAVA_OPTS"
TEST_DRIVER_MEMORY = "REPLICA_LENS_TEST_DRIVER_MEMORY"
# Not kept (8823280, reverted): a class-data-sharing archive of Spark's classes (`java -Xshare:dump` from the class
# list of an audit, for spark-submit's exact expanded class path; one dumped for `conf/:jars/*` is ignored without a
# word) given to every spark-submit JVM of the suite. An audit process of `replica-lens simulate`'s default snapshot:
# 33.0 -> 28.4 CPU-seconds of the machine, 21.4 -> 17.4 s (means of 3 alternated runs). But the suite starts only
# about fifteen such processes, and back to back in one new clone the whole suite took 786.2 s / 1495.6 CPU-seconds
# without the archive and 804.5 s / 1538.7 with it: no gain visible beside the 65 s it adds to the set-up.


def _without_child_options(options: str) -> str:
    return " ".join(option for option in options.split() if option != CHILD_JVM_OPTIONS)


# The suite audits dozens of snapshots with proven keys; drawing each report page's timeline pictures (matplotlib,
# about 0.1-0.3 s each and its import) is the point of a few tests only: those set the counts themselves (the
# browser test's server, the explain and redaction tests, which call the page and the job directly). Every audit
# still writes its page, in text.
REPORT_PICTURES = {"REPLICA_LENS_REPORT_PICTURES": "0", "REPLICA_LENS_REPORT_UI_PICTURES": "0"}


# Delta Lake's own Spark writer (jvm/lib/delta, ./scripts/setup-jvm.sh; or the folder REPLICA_LENS_DELTA_JARS names):
# the suite's one JVM per worker loads it, so the native tests (tests/test_native_delta.py) need no JVM of their own.
# Loaded is not used: every store and audit of the suite writes with the embedded engine unless a test pins
# ``engine="native"``. So the suite ignores the engine settings of the shell it runs in (a developer's
# REPLICA_LENS_DELTA_ENGINE or REPLICA_LENS_DELTA_JARS would switch every test to delta-spark, and the embedded
# engine's fast paths would go untested); the processes the tests start get neither either.
SUITE_DELTA_JARS_ENV = "REPLICA_LENS_TEST_DELTA_JARS"  # the folder found, for xdist's workers


def _suite_delta_jars() -> "str | None":
    from resources.settings import DELTA_JARS_ENV, PROJECT_DELTA_JARS, has_delta_spark

    for folder in (os.environ.get(SUITE_DELTA_JARS_ENV), os.environ.get(DELTA_JARS_ENV), PROJECT_DELTA_JARS):
        if has_delta_spark(folder):
            return folder
    return None


SUITE_DELTA_JARS = _suite_delta_jars()


def pytest_configure(config):
    from resources.settings import DELTA_ENGINE_ENV, DELTA_JARS_ENV

    # xdist's workers inherit the controller's environment, where this already ran.
    for variable in (SUBMIT_OPTS, DAEMON_OPTS):
        os.environ[variable] = f"{_without_child_options(os.environ.get(variable, ''))} {CHILD_JVM_OPTIONS}".strip()
    os.environ.update(REPORT_PICTURES)
    for name in (DELTA_ENGINE_ENV, DELTA_JARS_ENV):
        os.environ.pop(name, None)
    if SUITE_DELTA_JARS:
        os.environ[SUITE_DELTA_JARS_ENV] = SUITE_DELTA_JARS


# Test files that share a session fixture too costly to build twice: each group goes whole to one worker, its files
# one after the other (the group's place is its first file's), and its fixture is built once. The Kafka brokers (three
# JVMs) are started once for both broker files and stopped when the group is done (``pytest_runtest_teardown``), not
# kept idle to the end of the run: idle, three brokers take about a sixth of a core (9 CPU-seconds a minute).
FILE_GROUPS = {"test_watch.py": "kafka", "test_kafka_brokers.py": "kafka",
               "test_audit_e2e.py": "example", "test_blocking_checks.py": "example"}
GROUP_FIXTURES = {"kafka": "kafka_clusters", "example": "example_audit"}


def _group(name: str) -> str:
    return FILE_GROUPS.get(name, name)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    for name, group in FILE_GROUPS.items():  # a group ranks as its first file
        rank[group] = min(rank.get(group, len(LONGEST_FIRST)), rank.get(name, len(LONGEST_FIRST)))
    # Stable: each file's order kept, and a group's files in LONGEST_FIRST's order.
    items.sort(key=lambda item: (rank.get(_group(item.path.name), len(LONGEST_FIRST)),
                                 rank.get(item.path.name, len(LONGEST_FIRST))))


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which would return its LoadFileScheduling
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, but the files of one FILE_GROUPS group form one work unit (one worker, one fixture)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupedFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return _group(os.path.basename(path)) if os.path.basename(path) in FILE_GROUPS else path

    return GroupedFileScheduling(config, log)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """A group's session fixture is torn down after the group's last test (pytest builds it again if a later test
    asks for it), so that its processes do not idle through the rest of the run."""
    group = FILE_GROUPS.get(item.path.name)
    if group is None or (nextitem is not None and FILE_GROUPS.get(nextitem.path.name) == group):
        return
    for fixturedef in item._fixtureinfo.name2fixturedefs.get(GROUP_FIXTURES[group], ()):  # noqa: SLF001
        fixturedef.finish(item._request)  # noqa: SLF001


@pytest.fixture(scope="session")
def spark():
    from resources.session import STATUS_RETENTION, build_spark_session
    from resources.tuning import DEFAULT_DRIVER_MEMORY

    children = os.environ[SUBMIT_OPTS]
    os.environ[SUBMIT_OPTS] = _without_child_options(children)  # read when this process's JVM is launched
    try:
        # The tests that count Spark's work read the JVM's status stores, late in a run of thousands of jobs.
        # REPLICA_LENS_TEST_DRIVER_MEMORY runs the tests under another heap: the fuzz tests' memory bound is
        # measured with a small one (docs/venice-input.md, "Memory").
        memory = os.environ.get(TEST_DRIVER_MEMORY) or DEFAULT_DRIVER_MEMORY
        session = build_spark_session(
            master="local[2]", shuffle_partitions=4, app_name="replica-lens-tests",
            extra={**STATUS_RETENTION, **_kafka_source_jars()}, driver_memory=memory,
            delta_jars_dir=SUITE_DELTA_JARS,
        )
    finally:
        os.environ[SUBMIT_OPTS] = children
    arguments = session._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()  # noqa: SLF001
    assert CHILD_JVM_OPTIONS not in list(arguments), f"the suite's own JVM lost its optimizing compiler: {arguments}"
    interpret_by_default(session)
    yield session
    session.stop()


def _kafka_source_jars() -> dict[str, str]:
    """Spark's Kafka source in the suite's JVM when ``scripts/setup-jvm.sh`` resolved it: the broker tests
    (tests/test_kafka_brokers.py) dump in this process instead of starting a JVM per dump."""
    from pipelines.venice.kafka_dump import default_kafka_jars, kafka_jars

    folder = default_kafka_jars()
    return {"spark.jars": ",".join(kafka_jars(folder))} if folder else {}


@pytest.fixture(scope="session")
def kafka_clusters(tmp_path_factory):
    """One single-node KRaft cluster per region (dc-a, dc-b, dc-c), started together once per worker and
    shared by every broker test (each uses topics of its own); skipped without jvm/lib/kafka-broker."""
    from replica_lens.brokers import broker_jars_present, start_clusters

    if not broker_jars_present():
        pytest.skip("no Kafka broker jars in jvm/lib/kafka-broker: ./scripts/setup-jvm.sh resolves them with Maven")
    clusters = start_clusters(["dc-a", "dc-b", "dc-c"], root=str(tmp_path_factory.mktemp("brokers")))
    try:
        yield clusters
    finally:
        clusters.stop()


# Every snapshot the suite's own JVM handles is small, and most tests call the pipelines directly (no step, so no
# ``sized_for`` choosing interpreted evaluation for them as an audit does): compiling each of their queries' code
# costs more than it saves (about a tenth of test_incremental.py's time). The session interprets by default, as an
# operator's ``spark_config`` naming the keys would make it (steps then report "as configured"); the tests whose
# point is the choice itself, and the audit compiled on purpose, take the fixture ``compiled_by_default``.
def interpret_by_default(session) -> None:
    from resources.session import INTERPRETED

    for key, value in INTERPRETED.items():
        session.conf.set(key, value)


@pytest.fixture()
def compiled_by_default(spark):
    """The session as an audit process starts it: neither evaluation key set, so each step chooses for itself."""
    from resources.session import INTERPRETED

    for key in INTERPRETED:
        spark.conf.unset(key)
    try:
        yield spark
    finally:
        interpret_by_default(spark)


@dataclass
class ExampleAudit:
    """The shared example's audit (``example_audit``): its warehouse, the run's result, instance and step lines."""

    landing: Path
    warehouse: Path
    audit: Any  # replica_lens.audit.SnapshotAudit
    instance: Any  # the Dagster instance the run was recorded in
    printed: Any  # tests.test_audit_e2e._Recorder: each step's line, with when it was written


@pytest.fixture(scope="session")
def example_audit(spark, tmp_path_factory):
    """The shared example (tests/data/two-regions) audited once, as ``run_audit`` runs it, into a Dagster instance
    of its own with a ``StepPrinter`` recording each step's line as it ends. tests/test_audit_e2e.py checks the run
    itself; tests/test_blocking_checks.py starts from a copy of its warehouse (an audit that published every table).
    The tests read it and never write into it: a test that audits again copies the warehouse first."""
    import shutil

    import dagster as dg

    from replica_lens.audit import run_audit
    from replica_lens.console import StepPrinter
    from tests.rows import EXAMPLES
    from tests.test_audit_e2e import SETTINGS, _Recorder

    root = tmp_path_factory.mktemp("example-audit")
    landing, warehouse = root / "landing", root / "warehouse"
    shutil.copytree(EXAMPLES / "two-regions", landing / "two-regions")
    printed = _Recorder()
    with dg.DagsterInstance.ephemeral() as instance:
        audit = run_audit("two-regions", str(landing), str(warehouse), instance=instance,
                          watcher=StepPrinter(printed), **SETTINGS)
        yield ExampleAudit(landing, warehouse, audit, instance, printed)
