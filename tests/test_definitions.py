"""The code location loads, every job resolves, and every asset says what it is."""
from __future__ import annotations

import dagster as dg

from replica_lens.definitions import build_definitions, defs

STAGE_GROUPS = {"ingest", "watermarks", "divergence", "operations", "trend"}


def test_the_code_location_loads_and_every_job_resolves():
    repository = defs.get_repository_def()
    job_names = {job.name for job in repository.get_all_jobs()}
    assert {"audit_snapshot", "refresh_trend"} <= job_names
    for name in job_names:
        assert defs.resolve_job_def(name) is not None
    dg.Definitions.validate_loadable(defs)


def test_every_asset_has_a_group_a_description_and_kinds():
    specs = list(defs.resolve_all_asset_specs())
    assert specs, "no assets loaded"
    for spec in specs:
        assert spec.group_name in STAGE_GROUPS, spec.key
        assert spec.description and "\n" not in spec.description.strip(), spec.key
        assert {"spark", "delta"} <= set(spec.kinds), spec.key


def test_every_table_asset_has_a_blocking_schema_check():
    checks = {key for key in defs.resolve_asset_graph().asset_check_keys}
    for spec in defs.resolve_all_asset_specs():
        assert dg.AssetCheckKey(spec.key, "matches_schema") in checks, spec.key
    assert dg.AssetCheckKey(dg.AssetKey("divergence_reports"), "no_proven_divergence") in checks


def test_the_audit_job_covers_every_per_snapshot_asset_and_runs_in_one_process():
    job = defs.resolve_job_def("audit_snapshot")
    assert job.executor_def is dg.in_process_executor
    assert job.partitions_def is not None
    selected = {key.to_user_string() for key in job.asset_layer.selected_asset_keys}
    per_snapshot = {
        spec.key.to_user_string() for spec in defs.resolve_all_asset_specs() if spec.partitions_def is not None
    }
    assert per_snapshot and selected == per_snapshot


def test_sensors_and_schedule_run_by_default():
    for sensor in ("landing_sensor", "trend_after_audit"):
        assert defs.resolve_sensor_def(sensor).default_status == dg.DefaultSensorStatus.RUNNING
    schedule = defs.resolve_schedule_def("reaudit_newest_snapshot")
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING


def test_explicit_settings_build_the_same_graph(tmp_path):
    explicit = build_definitions(
        landing_root=str(tmp_path / "landing"), warehouse_root=str(tmp_path / "wh"), spark_master="local[1]",
        delta_jars_dir=None,
    )
    assert {s.key for s in explicit.resolve_all_asset_specs()} == {s.key for s in defs.resolve_all_asset_specs()}
