"""A table that fails its schema check is never published, and the stages downstream of it do not run."""
from __future__ import annotations

import shutil

import pyarrow as pa
import pytest

import pipelines.stream_pass
from replica_lens.audit import run_audit
from resources.delta_store import DeltaStore
from schemas.registry import struct_for
from tests.rows import EXAMPLES

SETTINGS = {"spark_master": "local[2]", "delta_jars_dir": None, "shuffle_partitions": 4}
SNAPSHOT = "two-regions"


@pytest.mark.slow
def test_a_table_in_the_middle_that_breaks_its_schema_is_not_published_and_blocks_downstream(
    spark, tmp_path, monkeypatch, example_audit
):
    """Catches: a table committed before (or whatever) its check says; downstream reading a bad table.

    A first audit publishes every table (the session's audit of the example, tests/conftest.py, whose
    warehouse is copied here). A second audit of the same snapshot, with a
    regression that writes negative offsets into reconstructed_watermarks (a stage in the
    middle of the lineage), must fail naming the check and its violations, leave
    reconstructed_watermarks and partition_watermarks (staged in the same step) at the
    versions and rows of the first audit, and not run the divergence stage.
    """
    landing = tmp_path / "landing"
    warehouse = tmp_path / "warehouse"
    shutil.copytree(EXAMPLES / SNAPSHOT, landing / SNAPSHOT)
    first = example_audit.audit  # the same snapshot and settings, every table published
    assert first.success, first.error
    shutil.copytree(example_audit.warehouse, warehouse)
    store = DeltaStore(warehouse_root=str(warehouse))
    step_tables = ("reconstructed_watermarks", "partition_watermarks")
    before = {t: store.version(t) for t in (*step_tables, "divergence_reports")}
    offsets_before = sorted(
        r["offset"] for r in store.read_snapshot(spark, "reconstructed_watermarks", SNAPSHOT,
                                                 struct_for("reconstructed_watermarks")).collect()
    )

    real = pipelines.stream_pass.written_rows

    def broken(table, rows):  # a regression that writes negative offsets (the pass writes this table's files itself)
        out = real(table, rows)
        if table != "reconstructed_watermarks":
            return out
        return out.set_column(out.schema.get_field_index("offset"), "offset", pa.array([-1] * out.num_rows, pa.int64()))

    monkeypatch.setattr(pipelines.stream_pass, "written_rows", broken)
    audit = run_audit(SNAPSHOT, str(landing), str(warehouse), **SETTINGS)

    assert not audit.success
    assert "reconstructed_watermarks:matches_schema" in audit.failed_checks
    assert audit.error and "reconstructed_watermarks:matches_schema" in audit.error
    assert "offset" in audit.error and "greater_than_or_equal_to(0)" in audit.error
    # Nothing of the failing step was committed: same versions, same rows.
    assert {t: store.version(t) for t in (*step_tables, "divergence_reports")} == before
    assert "reconstructed_watermarks" not in audit.metadata and "partition_watermarks" not in audit.metadata
    after = store.read_snapshot(spark, "reconstructed_watermarks", SNAPSHOT, struct_for("reconstructed_watermarks"))
    assert sorted(r["offset"] for r in after.collect()) == offsets_before
    # Nor were the tables of the same step (the stream pass: segments, summary, watermarks); downstream did not
    # run; steps beside it did.
    assert "heartbeat_segments" not in audit.metadata and "divergence_reports" not in audit.metadata
    assert "replication_lag" in audit.metadata and "exporter_positions" in audit.metadata
