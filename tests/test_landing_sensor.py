"""The landing sensor registers complete snapshots only, and never uses unsafe ids."""
from __future__ import annotations

import dagster as dg
import pytest

from assets.partitions import SNAPSHOTS
from replica_lens.jobs import build_landing_sensor
from resources.delta_store import UnsafeNameError
from resources.landing import LandingZone


def _snapshot(root, name: str, complete: bool = True) -> None:
    folder = root / name
    folder.mkdir()
    (folder / "part-0.jsonl").write_text('{"replica": "dc-a"}\n')
    if complete:
        (folder / "_SUCCESS").write_text("")


def _evaluate(instance, landing_root):
    context = dg.build_sensor_context(instance=instance, resources={"landing": LandingZone(root=str(landing_root))})
    return build_landing_sensor()(context)


def test_only_complete_snapshots_are_registered_and_requested(tmp_path):
    _snapshot(tmp_path, "snap-1")
    _snapshot(tmp_path, "snap-2", complete=False)
    with dg.instance_for_test() as instance:
        result = _evaluate(instance, tmp_path)

        assert [r.partition_key for r in result.run_requests] == ["snap-1"]
        assert [r.run_key for r in result.run_requests] == ["snap-1"]
        (request,) = result.dynamic_partitions_requests
        assert request.partitions_def_name == SNAPSHOTS and list(request.partition_keys) == ["snap-1"]


def test_a_snapshot_is_requested_once_and_picked_up_when_it_completes(tmp_path):
    _snapshot(tmp_path, "snap-1")
    _snapshot(tmp_path, "snap-2", complete=False)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(SNAPSHOTS, ["snap-1"])  # as the first evaluation would have done
        assert _evaluate(instance, tmp_path).run_requests == []

        (tmp_path / "snap-2" / "_SUCCESS").write_text("")
        assert [r.partition_key for r in _evaluate(instance, tmp_path).run_requests] == ["snap-2"]


def test_unsafe_folder_names_are_never_registered(tmp_path):
    _snapshot(tmp_path, "good")
    _snapshot(tmp_path, ".hidden")
    _snapshot(tmp_path, "has space")
    _snapshot(tmp_path, "x" * 130)
    with dg.instance_for_test() as instance:
        result = _evaluate(instance, tmp_path)
        assert [r.partition_key for r in result.run_requests] == ["good"]
        assert list(result.dynamic_partitions_requests[0].partition_keys) == ["good"]
    scan = LandingZone(root=str(tmp_path)).scan()
    assert sorted(scan.refused) == sorted([".hidden", "has space", "x" * 130])


def test_a_symlink_out_of_the_landing_folder_is_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    _snapshot(outside, "elsewhere")
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "linked").symlink_to(outside / "elsewhere")
    with dg.instance_for_test() as instance:
        assert _evaluate(instance, landing).run_requests == []


@pytest.mark.parametrize("bad", ["../etc", "..", "a/../../b", "/abs", ""])
def test_paths_are_never_built_from_unsafe_ids(tmp_path, bad):
    with pytest.raises(UnsafeNameError):
        LandingZone(root=str(tmp_path)).snapshot_path(bad)


def test_an_incomplete_snapshot_is_refused_with_a_clear_error(tmp_path):
    _snapshot(tmp_path, "half", complete=False)
    with pytest.raises(FileNotFoundError, match="incomplete"):
        LandingZone(root=str(tmp_path)).require_complete("half")


def test_the_sensor_interval_comes_from_the_environment_and_a_bad_one_is_refused(monkeypatch):
    # Catches: the setting ignored (the sensor stays at 30 s whatever the operator sets), read at
    # import time instead of when the definitions are built, or a zero / negative / fractional
    # interval accepted (Dagster would evaluate the sensor in a busy loop or fail at load).
    from replica_lens.definitions import build_definitions
    from replica_lens.jobs import DEFAULT_LANDING_SENSOR_INTERVAL_S, LANDING_SENSOR_INTERVAL_ENV, landing_sensor_interval
    from resources.errors import InvalidSetting

    def interval(defs: dg.Definitions) -> int:
        return defs.resolve_sensor_def("landing_sensor").minimum_interval_seconds

    monkeypatch.delenv(LANDING_SENSOR_INTERVAL_ENV, raising=False)
    assert interval(build_definitions()) == DEFAULT_LANDING_SENSOR_INTERVAL_S == 30
    monkeypatch.setenv(LANDING_SENSOR_INTERVAL_ENV, " 7 ")
    assert interval(build_definitions()) == 7
    assert interval(build_definitions(landing_sensor_interval_s=11)) == 11
    assert landing_sensor_interval("") == landing_sensor_interval(None) == 30
    for bad in ("0", "-5", "2.5", "soon"):
        with pytest.raises(InvalidSetting, match=f"{LANDING_SENSOR_INTERVAL_ENV} must be a whole number"):
            landing_sensor_interval(bad)
        monkeypatch.setenv(LANDING_SENSOR_INTERVAL_ENV, bad)
        with pytest.raises(InvalidSetting):
            build_definitions()
