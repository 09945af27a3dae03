"""The Spark session's settings and start-up, importable without Dagster.

``resources/spark.py`` wraps these in the run's resource; the command line imports this
module alone to start the JVM while it imports the rest (``start_in_background``), and
the benchmark's essential pass reads the same settings. Why the settings are what they
are: the module docstring of ``resources/spark.py`` and ``docs/performance.md``.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import sys
import threading
from contextlib import contextmanager
from typing import Iterator, Optional

from pyspark.sql import SparkSession

from resources.tuning import DEFAULT_DRIVER_MEMORY, DEFAULT_SHUFFLE_PARTITIONS

# For sessions that read their own work back from the JVM's status stores (the benchmark, the
# tests that count Spark jobs): Spark keeps only the last 1,000 jobs, stages and SQL executions
# by default and would drop part of a long run. Bookkeeping only; no effect on the work done.
STATUS_RETENTION = {
    key: "1000000" for key in ("spark.ui.retainedJobs", "spark.ui.retainedStages", "spark.sql.ui.retainedExecutions")
}

DATAFRAME_DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"
ARROW_MAX_BYTES_PER_BATCH = "spark.sql.execution.arrow.maxBytesPerBatch"
NO_BYTE_BOUND = str(2**31 - 1)  # INT_MAX: Spark's sentinel for "no byte bound on Arrow batches"
PYTHON_DAEMON_MODULE = "spark.python.daemon.module"
LOCAL_PYTHON_DAEMON = "resources.pyspark_daemon"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
# Tungsten's memory page: the unit in which sorts, hash aggregates and hash joins take memory. Spark sizes it from
# the heap (a 16th of a core's share of execution memory: 32 MiB for the 3 GiB driver on 2 cores), and every task
# that sorts or aggregates takes at least one whole page, zeroed, whether it holds 3 rows or 3 million. An audit runs
# thousands of such tasks over small partitions: with 32 MiB pages a JVM that audits again and again spent about a
# tenth of its time collecting pages already freed (docs/performance.md). A large partition takes more 2 MiB pages
# instead of fewer big ones (up to 8,192 pages, 16 GiB, per task). A user's ``spark.buffer.pageSize`` wins.
PAGE_SIZE = "spark.buffer.pageSize"
DEFAULT_PAGE_SIZE = "2m"


def delta_jars(delta_jars_dir: Optional[str]) -> list[str]:
    """The Delta Lake jars found in ``delta_jars_dir`` (empty when there are none)."""
    if not delta_jars_dir:
        return []
    found = sorted(glob.glob(os.path.join(delta_jars_dir, "*.jar")))
    has_spark = any(os.path.basename(j).startswith("delta-spark") for j in found)
    return found if has_spark else []


def workers_run_this_interpreter(extra: Optional[dict[str, str]] = None) -> bool:
    """Whether Spark's Python workers will run this process's interpreter (``spark.pyspark.python``, else
    ``PYSPARK_PYTHON``, else this one). Paths are compared as given, not resolved: two virtual
    environments' ``python`` links lead to the same binary but not to the same packages."""
    chosen = (extra or {}).get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON") or sys.executable
    found = shutil.which(chosen) or chosen
    return os.path.abspath(found) == os.path.abspath(sys.executable)


def spark_config(
    master: str = "local[*]",
    app_name: str = "replica-lens",
    shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS,
    driver_memory: str = DEFAULT_DRIVER_MEMORY,
    delta_jars_dir: Optional[str] = None,
    extra: Optional[dict[str, str]] = None,
) -> dict[str, str]:
    conf = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.driver.memory": driver_memory,
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.adaptive.enabled": "true",
        # shuffle_partitions is an upper bound: adaptive execution merges each shuffle's
        # partitions to about the advisory size, so small snapshots get a few tasks and
        # large ones get more, without retuning per snapshot.
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
        "spark.sql.adaptive.coalescePartitions.parallelismFirst": "false",
        "spark.sql.adaptive.advisoryPartitionSizeInBytes": "32m",
        # Joins and windows of one stage share their leading keys (e.g. pair and key): a frame
        # already clustered by those keys is joined without another exchange.
        "spark.sql.requireAllClusterKeysForCoPartition": "false",
        # A union of frames hash-partitioned alike claims that partitioning (Spark 4's default),
        # but with adaptive execution its rows could come out as every child's partitions one
        # after another: a join zipping it with the other side, shuffled to the claimed count,
        # failed ("Can't zip RDDs with unequal numbers of partitions: List(4, 12)", a carried
        # state's rows joined to the comparison's output made on the driver). Shuffle instead.
        "spark.sql.unionOutputPartitioning": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Arrow makes createDataFrame/toPandas fast where the driver must touch rows.
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.parquet.compression.codec": "zstd",
        # One audit generates a few hundred distinct classes; Spark's cache of compiled code
        # keeps 100 by default, so a second audit in the same JVM (the CLI with several
        # snapshots, a test session) compiled them all again (docs/performance.md).
        "spark.sql.codegen.cache.maxEntries": str(CODEGEN_CACHE_ENTRIES),
        # PySpark 4 records the Python call site of every DataFrame and Column call for error
        # messages: each call becomes several round trips to the JVM instead of one
        # (docs/performance.md).
        # Errors still name the failing expression; set "true" to see the Python line too.
        DATAFRAME_DEBUGGING: "false",
        # Batches sent to Spark's Python workers (the Leap Frog comparison, the gzip and Venice
        # readers) are cut at maxRecordsPerBatch rows. With a byte bound as well (64 MB by
        # default) Spark measures the Arrow batch after every row, walking every column's
        # buffers. INT_MAX turns the per-row measurement off (Spark's own sentinel); the
        # comparison's gain is in docs/performance.md.
        ARROW_MAX_BYTES_PER_BATCH: NO_BYTE_BOUND,
        PAGE_SIZE: DEFAULT_PAGE_SIZE,
    }
    if master.startswith("local") and workers_run_this_interpreter(extra):
        # The Python workers import PySpark from the installed package (cached bytecode), not
        # from Spark's zips (compiled from source in every worker process; see
        # resources/pyspark_daemon.py and docs/performance.md). Local mode only, and only when
        # the workers run this interpreter (which has the project): a cluster's executors, or
        # another Python the user chose for the workers, need not have it.
        conf[PYTHON_DAEMON_MODULE] = LOCAL_PYTHON_DAEMON
    for option in JAVA_OPTION_KEYS:
        conf[option] = java_options((extra or {}).get(option, ""), driver=option == JAVA_OPTION_KEYS[0])
    jars = delta_jars(delta_jars_dir)
    if jars:
        conf["spark.sql.extensions"] = DELTA_EXTENSION
        conf["spark.sql.catalog.spark_catalog"] = DELTA_CATALOG
    # Jars given in ``extra`` (Spark's Kafka source, say) join the Delta jars instead of replacing them.
    extra_jars = [jar for jar in (extra or {}).get("spark.jars", "").split(",") if jar and jar not in jars]
    if jars or extra_jars:
        conf["spark.jars"] = ",".join([*jars, *extra_jars])
    conf.update({k: v for k, v in (extra or {}).items() if k not in (*JAVA_OPTION_KEYS, "spark.jars")})
    return conf


# Spark's interpreted evaluation: no whole-stage code generation, and every expression
# (projections, predicates, orderings) interpreted instead of compiled. Runtime SQL settings,
# read when a query is planned and executed, so one session switches per step.
INTERPRETED = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}
# Small inputs run faster interpreted (no compiling); large ones compiled, the ingestion first.
# The threshold lies between the two, as measured on whole audits (docs/performance.md).
INTERPRETED_MAX_ROWS = 20_000


class _EvaluationModes:
    """Which evaluation mode the session's open blocks use, so that steps side by side agree.

    The two settings are the session's, read by every query it plans: steps that run at the
    same time (``replica_lens/executor.py``) must agree. A small step (interpreted) that
    comes while compiled blocks are open joins them compiled; a large step (compiled) that
    comes while interpreted blocks are open waits until they have closed, then switches.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._mode: Optional[str] = None  # what the open blocks use
        self._users = 0

    @contextmanager
    def holding(self, session: SparkSession, wanted: str) -> Iterator[str]:
        conf = session.conf
        with self._changed:
            # Keys set while no block is open are the user's own (spark_config): left alone.
            if not self._users and any(conf.get(key, None) is not None for key in INTERPRETED):
                configured = True
            else:
                configured = False
                if wanted == "interpreted" and self._users and self._mode == "compiled":
                    # A small step beside a compiled one runs compiled (correct, and cheap at its size) rather than
                    # wait for it; only a large step waits, since interpreted evaluation at scale is slow.
                    wanted = "compiled"
                while self._users and self._mode != wanted:
                    self._changed.wait()
                if not self._users and wanted == "interpreted":
                    for key, value in INTERPRETED.items():
                        conf.set(key, value)
                self._mode = wanted
                self._users += 1
        if configured:
            yield "as configured"
            return
        try:
            yield wanted
        finally:
            with self._changed:
                self._users -= 1
                if not self._users:
                    if self._mode == "interpreted":
                        for key in INTERPRETED:
                            conf.unset(key)
                    self._mode = None
                    self._changed.notify_all()


_MODES = _EvaluationModes()


@contextmanager
def code_generation(session: SparkSession, rows: Optional[int], max_interpreted_rows: int) -> Iterator[str]:
    """Within the block, Spark interprets when ``rows`` (a step's input) is known and at most ``max_interpreted_rows``.

    Yields what was chosen, for the step's metadata: ``"interpreted"`` or ``"compiled"``. A
    session whose settings already name either key (the user's ``spark_config``) is left
    as it is (``"as configured"``). The previous settings are restored on the way out.
    Blocks open at the same time (steps side by side) share one mode: a small step joins open
    compiled blocks compiled, a large one waits for open interpreted blocks to close
    (``_EvaluationModes``); what was chosen is yielded either way.
    """
    wanted = "interpreted" if rows is not None and rows <= max_interpreted_rows else "compiled"
    with _MODES.holding(session, wanted) as chosen:
        yield chosen


PARQUET_BATCH_KEY = "spark.sql.parquet.columnarReaderBatchSize"


@contextmanager
def session_settings(session: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """Within the block, the queries this session plans use ``settings``; the previous values are restored after.

    The settings are the session's: a step planning a query beside the block plans it with them too.
    """
    previous = {key: session.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        session.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                session.conf.unset(key)
            else:
                session.conf.set(key, value)


@contextmanager
def parquet_batches(session: SparkSession, rows: Optional[int]) -> Iterator[Optional[int]]:
    """Within the block, the queries this session plans read Parquet ``rows`` rows per batch (None: unchanged).

    For a query that reads a column of large values (the witnesses' values): Spark's reader holds a
    whole batch of a column in memory, and its default of 4096 rows of values of megabytes is more
    than an executor's heap. A step planning a query beside this block reads with the smaller
    batches too, which costs it time, never a result.
    """
    if rows is None:
        yield None
        return
    with session_settings(session, {PARQUET_BATCH_KEY: str(rows)}):
        yield rows


# Compiled generated classes kept per JVM (static: read when the session starts).
CODEGEN_CACHE_ENTRIES = 2000

# The throughput collector: an audit is a batch of CPU-bound sorts, windows and writes on few
# cores, where G1's concurrent marking competes with the task threads (measured on a 2-core
# machine: docs/performance.md). A collector the user chooses in ``extraJavaOptions`` wins.
DEFAULT_JAVA_OPTIONS = "-XX:+UseParallelGC"
JAVA_OPTION_KEYS = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")


# The driver's log configuration while the session starts (the level is set once it is up):
# without it Spark prints its default profile's banner and Hadoop's native-library warning.
LOG_CONFIGURATION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")


def java_options(user_options: str, driver: bool = False) -> str:
    """The JVM options of the driver or executors: the user's, after the project's defaults unless they pick their own.

    Defaults: the throughput collector, and for the driver the project's log4j2 configuration
    (``resources/log4j2.properties``), unless the options name a collector or a log4j2
    configuration file.
    """
    options = user_options.strip()
    if driver and "log4j2.configurationFile" not in options and " " not in LOG_CONFIGURATION:
        options = f"-Dlog4j2.configurationFile=file:{LOG_CONFIGURATION} {options}".strip()
    if re.search(r"-XX:\+Use\w*GC\b", options):
        return options
    return f"{DEFAULT_JAVA_OPTIONS} {options}".strip()


def build_spark_session(log_level: str = "ERROR", **kwargs) -> SparkSession:
    """Start (or reuse) this process's Spark session with the project's configuration; Spark logs at ``log_level``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    for key, value in spark_config(**kwargs).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    return session


def has_native_delta(session: SparkSession) -> bool:
    """Whether delta-spark's classes are loaded in this session's JVM."""
    if DELTA_EXTENSION not in (session.conf.get("spark.sql.extensions", "") or ""):
        return False
    jvm = session._jvm  # noqa: SLF001
    try:
        # Through Spark's class loader: the jars of ``spark.jars`` are on it, not on the JVM's application class
        # path that the one-argument ``Class.forName`` called over Py4J searches (it never finds them).
        loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
        jvm.java.lang.Class.forName("io.delta.tables.DeltaTable", False, loader)
    except Exception:  # noqa: BLE001 - any JVM error means the jars are not there
        return False
    return True


def start_in_background(**kwargs) -> threading.Thread:
    """Start this process's Spark session (``build_spark_session(**kwargs)``) on a thread, and return it.

    Starting the JVM takes seconds that the caller can spend importing Dagster and
    building its definitions. The run's resource later asks for the same session and gets
    it (``getOrCreate`` waits for a start in progress): ``kwargs`` must be the settings the
    resource will use, or the resource's runtime settings win and its static ones are
    ignored. A failure to start is left for the resource to meet again and report.
    """

    def start() -> None:
        try:
            build_spark_session(**kwargs)
        except Exception:  # noqa: BLE001 - the resource starts it again and reports the error
            pass

    thread = threading.Thread(target=start, name="spark-start", daemon=True)
    thread.start()
    return thread

