"""The code location loads, every job resolves to what it should run, and every asset says what it is."""
from __future__ import annotations

import dagster as dg
import pytest

from assets.partitions import SNAPSHOTS
from replica_lens.definitions import build_definitions, defs
from replica_lens.executor import threaded_in_process_executor
from tests.rows import PER_SNAPSHOT_TABLES

STAGE_GROUPS = {"ingest", "watermarks", "divergence", "operations", "trend"}
# The tables of the README, one asset each; all but the trend are per snapshot.
PER_SNAPSHOT_ASSETS = set(PER_SNAPSHOT_TABLES)
ASSETS = PER_SNAPSHOT_ASSETS | {"audit_trend"}
# The non-schema checks, none of them blocking: a divergence or a slow replica is a finding, not a broken table.
FINDING_CHECKS = {
    ("divergence_reports", "no_proven_divergence"),
    ("replication_lag", "lag_within_bounds"),
    ("exporter_positions", "exporters_within_bounds"),
    ("raw_topic_snapshots", "every_topic_decoded"),
    ("broker_cuts", "regions_answering"),
}
ENV_SETTINGS = {
    ("spark", "master"): "REPLICA_LENS_SPARK_MASTER",
    ("spark", "delta_jars_dir"): "REPLICA_LENS_DELTA_JARS",
    ("store", "warehouse_root"): "REPLICA_LENS_WAREHOUSE",
    ("landing", "root"): "REPLICA_LENS_LANDING",
}


def _keys(keys) -> set[str]:
    return {key.to_user_string() for key in keys}


def test_the_code_location_loads_with_exactly_its_jobs_sensors_and_schedule():
    dg.Definitions.validate_loadable(defs)
    repository = defs.get_repository_def()
    # Dagster adds its implicit asset job; every other job is one of ours.
    assert {job.name for job in repository.get_all_jobs()} - {"__ASSET_JOB"} == {
        "audit_snapshot", "refresh_trend", "vacuum_warehouse", "explain_key", "watch_brokers",
    }
    assert {sensor.name for sensor in repository.sensor_defs} == {"landing_sensor", "trend_after_audit", "trend_catch_up",
                                                                   "broker_watch"}
    assert {schedule.name for schedule in repository.schedule_defs} == {"reaudit_newest_snapshot", "vacuum_warehouse_daily"}
    # One process per run: Spark starts once and every step shares its JVM. The audit's independent steps run
    # side by side on threads (a multiprocess executor would start a JVM per step).
    assert defs.resolve_job_def("audit_snapshot").executor_def is threaded_in_process_executor
    for name in ("refresh_trend", "vacuum_warehouse", "explain_key", "watch_brokers"):
        job = defs.resolve_job_def(name)
        assert job.name == name
        assert job.executor_def is dg.in_process_executor, name
    # Explaining a key reads the published tables with delta-rs: no Spark session is started for it.
    assert "spark" not in defs.resolve_job_def("explain_key").required_resource_keys
    # Materializations launched from the UI (outside the jobs) too.
    assert defs.executor is threaded_in_process_executor


def test_every_asset_has_a_group_a_description_and_kinds():
    specs = list(defs.resolve_all_asset_specs())
    assert _keys(spec.key for spec in specs) == ASSETS
    for spec in specs:
        assert spec.group_name in STAGE_GROUPS, spec.key
        assert spec.description and "\n" not in spec.description.strip(), spec.key
        assert {"spark", "delta"} <= set(spec.kinds), spec.key
    per_snapshot = {spec.key.to_user_string() for spec in specs if spec.partitions_def is not None}
    assert per_snapshot == PER_SNAPSHOT_ASSETS


def test_every_table_asset_has_a_blocking_schema_check_and_the_findings_do_not_block():
    graph = defs.resolve_asset_graph()
    checks = {(key.asset_key.to_user_string(), key.name): graph.get_check_spec(key) for key in graph.asset_check_keys}
    assert set(checks) == {(asset, "matches_schema") for asset in ASSETS} | FINDING_CHECKS
    for (asset, name), spec in checks.items():
        # A broken table must stop the stages downstream of it; a finding must not.
        assert spec.blocking is (name == "matches_schema"), (asset, name)


def test_the_audit_job_covers_every_per_snapshot_asset_and_runs_in_one_process():
    job = defs.resolve_job_def("audit_snapshot")
    assert isinstance(job.partitions_def, dg.DynamicPartitionsDefinition) and job.partitions_def.name == SNAPSHOTS
    assert _keys(job.asset_layer.selected_asset_keys) == PER_SNAPSHOT_ASSETS
    # The trend reads every snapshot: its own unpartitioned job, started after each audit.
    trend = defs.resolve_job_def("refresh_trend")
    assert trend.partitions_def is None
    assert _keys(trend.asset_layer.selected_asset_keys) == {"audit_trend"}


def test_sensors_and_schedule_target_their_jobs_and_run_by_default():
    landing = defs.resolve_sensor_def("landing_sensor")
    assert landing.job_name == "audit_snapshot" and landing.minimum_interval_seconds == 30
    assert landing.required_resource_keys == {"landing"}
    trend = defs.resolve_sensor_def("trend_after_audit")
    assert isinstance(trend, dg.RunStatusSensorDefinition) and trend.job_name == "refresh_trend"
    catch_up = defs.resolve_sensor_def("trend_catch_up")
    assert catch_up.job_name == "refresh_trend" and catch_up.required_resource_keys == {"store"}
    watch = defs.resolve_sensor_def("broker_watch")
    assert watch.job_name == "watch_brokers" and watch.minimum_interval_seconds == 60
    for sensor in (landing, trend, catch_up, watch):
        assert sensor.default_status == dg.DefaultSensorStatus.RUNNING, sensor.name
    schedule = defs.resolve_schedule_def("reaudit_newest_snapshot")
    assert (schedule.job_name, schedule.cron_schedule) == ("audit_snapshot", "0 * * * *")
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING


def test_the_vacuum_schedule_is_daily_off_by_default_and_sets_the_retention():
    # Catches: housekeeping switched on for every deployment (a vacuum bounds time travel: an
    # operator opts in), the schedule aimed at another job, or its retention not in run config.
    schedule = defs.resolve_schedule_def("vacuum_warehouse_daily")
    assert (schedule.job_name, schedule.cron_schedule) == ("vacuum_warehouse", "30 3 * * *")
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED and schedule.execution_timezone == "UTC"
    with dg.build_schedule_context() as context:
        (request,) = schedule.evaluate_tick(context).run_requests
    assert request.run_config["ops"]["vacuum_tables"]["config"] == {"retention_hours": 168}
    job = defs.resolve_job_def("vacuum_warehouse")
    assert "store" in job.required_resource_keys and "spark" not in job.required_resource_keys  # no JVM started


def test_resource_settings_come_from_the_environment_when_a_run_starts(tmp_path, monkeypatch):
    # Nothing is read at import time: the loaded resources hold the variables, not their values.
    for (resource, field), variable in ENV_SETTINGS.items():
        setting = getattr(defs.resources[resource], field)
        assert isinstance(setting, dg.EnvVar) and setting.env_var_name == variable, (resource, field, setting)
    # ...and they resolve to the environment's values when the resources are built (Spark is not started here).
    monkeypatch.setenv("REPLICA_LENS_LANDING", str(tmp_path / "landing-from-env"))
    monkeypatch.setenv("REPLICA_LENS_WAREHOUSE", str(tmp_path / "warehouse-from-env"))
    with dg.build_resources({name: defs.resources[name] for name in ("landing", "store")}) as built:
        assert built.landing.root == str(tmp_path / "landing-from-env")
        assert built.store.warehouse_root == str(tmp_path / "warehouse-from-env")


def test_explicit_settings_build_the_same_graph_with_those_values(tmp_path):
    explicit = build_definitions(
        landing_root=str(tmp_path / "landing"), warehouse_root=str(tmp_path / "wh"), spark_master="local[1]",
        delta_jars_dir=None,
    )
    assert {s.key for s in explicit.resolve_all_asset_specs()} == {s.key for s in defs.resolve_all_asset_specs()}
    assert explicit.resolve_asset_graph().asset_check_keys == defs.resolve_asset_graph().asset_check_keys
    assert explicit.resources["landing"].root == str(tmp_path / "landing")
    assert explicit.resources["store"].warehouse_root == str(tmp_path / "wh")
    assert explicit.resources["spark"].master == "local[1]" and explicit.resources["spark"].delta_jars_dir is None


def test_the_session_runs_the_throughput_collector_unless_the_user_picks_one():
    # Catches: the default collector dropped (G1 back, ~9% slower audits on few cores), or added
    # next to a collector the user chose (the JVM refuses to start with two), or the user's other
    # JVM options lost when the default is added.
    from resources.session import spark_config

    from resources.session import LOG_CONFIGURATION

    logs = f"-Dlog4j2.configurationFile=file:{LOG_CONFIGURATION}"
    default = spark_config()
    assert default["spark.driver.extraJavaOptions"] == f"-XX:+UseParallelGC {logs}"
    assert default["spark.executor.extraJavaOptions"] == "-XX:+UseParallelGC"
    chosen = spark_config(extra={"spark.driver.extraJavaOptions": "-XX:+UseG1GC -Xss4m"})
    assert chosen["spark.driver.extraJavaOptions"] == f"{logs} -XX:+UseG1GC -Xss4m"
    assert chosen["spark.executor.extraJavaOptions"] == "-XX:+UseParallelGC"
    kept = spark_config(
        extra={"spark.executor.extraJavaOptions": "-Dreplica.lens=1", "spark.yarn.am.extraJavaOptions": "-Xss4m"}
    )
    assert kept["spark.executor.extraJavaOptions"] == "-XX:+UseParallelGC -Dreplica.lens=1"
    # Other JVMs' options pass through untouched.
    assert kept["spark.yarn.am.extraJavaOptions"] == "-Xss4m"


def test_the_session_keeps_an_audits_compiled_code_for_the_next_audit(spark):
    # Catches: Spark's default cache of 100 compiled classes back, so that every audit after the
    # first in one JVM (the CLI with several snapshots, the test suite) compiles its ~500 classes
    # again. The setting is static: only the session's start can set it, so it is read back there.
    from resources.session import CODEGEN_CACHE_ENTRIES, spark_config

    assert spark_config()["spark.sql.codegen.cache.maxEntries"] == str(CODEGEN_CACHE_ENTRIES)
    assert int(spark.conf.get("spark.sql.codegen.cache.maxEntries")) == CODEGEN_CACHE_ENTRIES >= 1000


def test_the_session_takes_memory_for_sorts_and_aggregates_in_small_pages_unless_the_user_sizes_them(spark):
    # Catches: the page size dropped, so that Spark sizes pages from the heap again (32 MiB for the 3 GiB driver on
    # 2 cores: every small task that sorts or aggregates zeroes a whole page, and the JVM spends a tenth of an audit
    # in full collections), or a user's own size overridden. Static: read back from the running JVM's memory manager.
    from resources.session import DEFAULT_PAGE_SIZE, PAGE_SIZE, spark_config

    assert spark_config()[PAGE_SIZE] == DEFAULT_PAGE_SIZE
    assert spark_config(extra={PAGE_SIZE: "16m"})[PAGE_SIZE] == "16m"
    # The size docs/performance.md measured, as the JVM the session started uses it.
    assert spark.sparkContext._jsc.sc().env().memoryManager().pageSizeBytes() == 2 * 1024 * 1024  # noqa: SLF001


SPARK_CHATTER = ("log4j profile", "Setting default log level", " WARN ", " INFO ")


def test_a_users_own_log_configuration_reaches_the_driver(tmp_path):
    # Catches: the project's log4j2 file overriding a user's own log configuration. (That the
    # project's file reaches the driver otherwise, with no chatter, is checked on the stderr of
    # the background start's process, in the next test.)
    import json
    import os
    import subprocess
    import sys

    script = "from resources.session import build_spark_session as b; import json, sys; " \
             "print(b(extra=json.loads(sys.argv[1])).range(3).count())"
    own = tmp_path / "log4j2.properties"
    own.write_text("rootLogger.level = info\nrootLogger.appenderRef.stderr.ref = console\n"
                   "appender.console.type = Console\nappender.console.name = console\n"
                   "appender.console.target = SYSTEM_ERR\n"
                   "logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer\n"
                   "logger.gateway.level = info\n")

    extra = {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{own}"}
    done = subprocess.run([sys.executable, "-c", script, json.dumps(extra)], capture_output=True, text=True,
                          timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.returncode == 0 and done.stdout.strip() == "3", done.stderr
    chatty = done.stderr
    # The user's file is the one read: Spark's INFO lines, which the project's file hides, are there.
    assert "Running Spark version" in chatty, chatty


def test_the_default_collector_reaches_the_jvm_the_session_starts(spark):
    # Catches: the option set where the JVM never reads it (after launch, or under a key Spark
    # ignores in local mode): the suite's session is started by build_spark_session.
    beans = spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()  # noqa: SLF001
    names = {bean.getName() for bean in beans}
    assert names == {"PS Scavenge", "PS MarkSweep"}, names


def test_building_expressions_costs_few_round_trips_to_the_jvm(spark):
    # Catches: PySpark's call-site capture left on (every Column or DataFrame call becomes ~5
    # round trips to the JVM instead of ~1: a tiny audit made 72,000 of them instead of 25,000).
    from pyspark.errors.utils import is_debugging_enabled
    from pyspark.sql import functions as F

    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    assert not is_debugging_enabled()
    client = spark.sparkContext._gateway._gateway_client  # noqa: SLF001
    sent = []
    original = type(client).send_command

    def counting(self, command, *args, **kwargs):
        # py4j also sends "m\nd\n..." (release a JVM object) whenever Python's garbage
        # collector frees a proxy, whatever the code under test does: not counted.
        if not command.startswith("m\nd\n"):
            sent.append(command)
        return original(self, command, *args, **kwargs)

    type(client).send_command = counting
    try:
        F.col("a").cast("bigint").alias("b")
        F.coalesce(F.col("x"), F.lit(0))
    finally:
        type(client).send_command = original
    # Six Column calls: 26 round trips without the capture, 101 with it (PySpark 4.2).
    assert 0 < len(sent) <= 40, len(sent)


def test_the_cli_starts_spark_while_it_imports_and_the_run_gets_that_same_session_without_chatter():
    # Catches: the background start (resources/session.py start_in_background, called by
    # `replica-lens audit` before it imports Dagster) giving the run a session without the
    # project's static settings, a second SparkContext, or a Dagster import on the CLI's early
    # path (the overlap would then be lost). And the project's log4j2 file not reaching the
    # driver JVM: Spark's banner "Using Spark's default log4j profile", its "Setting default log
    # level" notice and start-up WARN lines back on every audit's stderr.
    import os
    import subprocess
    import sys

    script = (
        "import sys, json\n"
        "from pyspark.sql import SparkSession\n"
        "from resources.session import start_in_background, build_spark_session\n"
        "t = start_in_background(master='local[1]', shuffle_partitions=7)\n"
        "early = 'dagster' in sys.modules\n"
        "t.join(120)\n"
        "started = SparkSession._instantiatedSession\n"  # what the thread alone started
        "seen = {'early_dagster': early, 'alive': t.is_alive(), 'started': started is not None}\n"
        "if started is not None:\n"
        "    seen.update(partitions=started.conf.get('spark.sql.shuffle.partitions'),\n"
        "                cache=started.conf.get('spark.sql.codegen.cache.maxEntries'),\n"
        "                reused=build_spark_session(master='local[1]', shuffle_partitions=7) is started)\n"
        "print(json.dumps(seen))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.returncode == 0, done.stderr
    for chatter in SPARK_CHATTER:
        assert chatter not in done.stderr, done.stderr
    import json

    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # The thread alone started the session with the project's static settings and the caller's; the
    # resource's later call gets that session back instead of starting another.
    assert seen == {"early_dagster": False, "alive": False, "started": True, "partitions": "7", "cache": "2000",
                    "reused": True}


def test_python_batches_stay_bounded_by_rows_without_the_per_row_byte_check(spark):
    # Catches: the session's Arrow settings (resources/session.py) leaving Python batches unbounded
    # (e.g. maxRecordsPerBatch <= 0 together with no byte bound: a whole partition in one batch, in
    # the comparison's worker memory), or the byte bound back at Spark's default, which measures the
    # batch after every row (6% of the divergence step at 2M rows).
    import pyarrow as pa

    from resources.session import ARROW_MAX_BYTES_PER_BATCH, NO_BYTE_BOUND

    assert spark.conf.get(ARROW_MAX_BYTES_PER_BATCH) == NO_BYTE_BOUND
    limit = int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch"))
    assert 0 < limit <= 10_000

    def sizes(batches):
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"rows": [batch.num_rows]})

    seen = [r["rows"] for r in spark.range(0, 2 * limit + 5, 1, numPartitions=1).mapInArrow(sizes, "rows long").collect()]
    assert sum(seen) == 2 * limit + 5 and max(seen) <= limit, seen


def test_local_python_workers_import_pyspark_from_the_installed_package_not_from_sparks_zips(spark):
    # Catches: the local session not naming resources.pyspark_daemon (every worker process then compiles
    # PySpark from source out of pyspark.zip, about 0.6 s of CPU each), or the daemon module leaving the zips
    # first on the workers' path. The worker reports where it imported PySpark from and whether any zip is left.
    import pyarrow as pa

    from resources.session import LOCAL_PYTHON_DAEMON, PYTHON_DAEMON_MODULE

    assert spark.sparkContext.getConf().get(PYTHON_DAEMON_MODULE) == LOCAL_PYTHON_DAEMON

    def where(batches):
        import sys

        import pyspark

        for _ in batches:
            zips = [e for e in sys.path if e.endswith(".zip") and "/pyspark/" in e]
            yield pa.RecordBatch.from_pydict({"pyspark": [pyspark.__file__], "zips": [",".join(zips)]})

    row = spark.range(1).mapInArrow(where, "pyspark string, zips string").first()
    assert ".zip" not in row["pyspark"] and row["zips"] == "", row


def test_the_worker_daemon_drops_only_the_zips_inside_the_installed_pyspark(tmp_path):
    # Catches: dropping the zips of a separate Spark distribution (maybe another version than the installed
    # package, which must not replace them), or keeping pip's own zips.
    import os

    import pyspark

    from resources.pyspark_daemon import zips_inside_installed_pyspark

    package = os.path.dirname(pyspark.__file__)
    site = os.path.dirname(package)
    own = [os.path.join(package, "python", "lib", "pyspark.zip"), os.path.join(package, "python", "lib", "py4j-src.zip")]
    assert zips_inside_installed_pyspark([*own, "/elsewhere", site]) == own
    other = [str(tmp_path / "spark" / "python" / "lib" / "pyspark.zip"), own[1]]
    assert zips_inside_installed_pyspark([*other, site]) == []
    assert zips_inside_installed_pyspark([*own, str(tmp_path)]) == []  # no PySpark found beside the zips
    assert zips_inside_installed_pyspark([site, "/x/other.zip"]) == []


def test_the_worker_daemon_is_named_only_for_local_workers_that_run_this_interpreter(monkeypatch):
    # Catches: naming resources.pyspark_daemon on a cluster (its executors need not have the project) or for
    # workers the user pointed at another Python (which may lack it): every Python task would then fail to start.
    import sys

    from resources.session import LOCAL_PYTHON_DAEMON, PYTHON_DAEMON_MODULE, spark_config

    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    assert spark_config(master="local[2]")[PYTHON_DAEMON_MODULE] == LOCAL_PYTHON_DAEMON
    assert PYTHON_DAEMON_MODULE not in spark_config(master="spark://127.0.0.1:7077")
    assert PYTHON_DAEMON_MODULE not in spark_config(master="local[2]", extra={"spark.pyspark.python": "/usr/bin/python3"})
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    assert PYTHON_DAEMON_MODULE not in spark_config(master="local[2]")
    monkeypatch.delenv("PYSPARK_PYTHON")
    assert spark_config(master="local[*]")[PYTHON_DAEMON_MODULE] == LOCAL_PYTHON_DAEMON


def test_a_report_page_that_cannot_be_written_leaves_the_step_standing(tmp_path):
    """The divergence step's tables are committed before its page is written: a page that fails (here, a warehouse
    under a plain file) is named in the metadata and logged, never raised. Catches the step failing after its
    commit, which would show published tables as a failed materialization."""
    from assets.divergence import report_metadata
    from resources.delta_store import DeltaStore
    from resources.reports import ReportSettings

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    context = dg.build_asset_context()
    metadata = report_metadata(context, DeltaStore(warehouse_root=str(blocker / "warehouse")), ReportSettings(),
                               "s1", {"COMPARED": 0})
    assert set(metadata) == {"report_error"} and "Error" in metadata["report_error"], metadata


def test_report_picture_counts_come_from_the_resource_else_the_environment(monkeypatch):
    """Catches a count that ignores its field or its variable, and a bad value taken for 0 (no pictures, silently)."""
    from resources.errors import InvalidSetting
    from resources.reports import DEFAULT_PICTURES, PICTURES_ENV, ReportSettings

    monkeypatch.delenv(PICTURES_ENV, raising=False)
    assert ReportSettings().page_pictures() == DEFAULT_PICTURES
    monkeypatch.setenv(PICTURES_ENV, "2")
    assert (ReportSettings().page_pictures(), ReportSettings(pictures=5).page_pictures()) == (2, 5)
    monkeypatch.setenv(PICTURES_ENV, "many")
    with pytest.raises(InvalidSetting, match=PICTURES_ENV):
        ReportSettings().page_pictures()
