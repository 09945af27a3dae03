"""Staged files written from Arrow batches by a task (``resources/staged_files.py``): a task's one file, in place or not at all."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from resources.staged_files import ArrowStage

SCHEMA = pa.schema([("replica", pa.string()), ("offset", pa.int64()), ("vector", pa.map_(pa.string(), pa.int64()))])


def _stage(folder) -> ArrowStage:
    return ArrowStage(table="t", uri=str(folder), relative_dir="write-x", snapshot_id="s", schema=SCHEMA,
                      fs=pafs.LocalFileSystem(), path=str(folder), dictionary_columns=("replica",))


def _batch(offsets, extra: bool = False) -> pa.RecordBatch:
    columns = {"offset": pa.array(offsets, pa.int64()), "replica": pa.array(["r1"] * len(offsets)),
               "vector": pa.array([[("dc-a", o)] for o in offsets], pa.map_(pa.string(), pa.int64()))}
    if extra:
        columns["kind"] = pa.array(["PUT"] * len(offsets))
    return pa.RecordBatch.from_pydict(columns)


def test_a_task_s_file_holds_its_rows_in_the_stage_s_columns(tmp_path, monkeypatch):
    # Catches rows lost at a row group's edge or left in the buffer at close, columns taken by position instead of by
    # name (the batch has them in another order, with one more), and a file without the stage's schema.
    import resources.staged_files as staged_files

    monkeypatch.setattr(staged_files, "ROW_GROUP_ROWS", 5)
    file = _stage(tmp_path).files(3)
    for start in range(0, 23, 4):
        file.write(_batch(list(range(start, min(start + 4, 23))), extra=True))
    assert file.close() == 23
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part-00003.parquet"]
    written = pq.read_table(tmp_path / "part-00003.parquet")
    assert written.schema.equals(SCHEMA)
    assert written.column("offset").to_pylist() == list(range(23))
    assert written.column("vector").to_pylist()[7] == [("dc-a", 7)]
    groups = pq.ParquetFile(tmp_path / "part-00003.parquet").metadata
    assert groups.num_row_groups > 1 and max(groups.row_group(i).num_rows for i in range(groups.num_row_groups)) <= 5


def test_a_task_run_again_leaves_one_file_and_a_failed_one_none(tmp_path):
    # Catches a retried or speculative task adding a second file (its rows twice in the table), a failed task's
    # partial file left in place, and an empty task writing a file with no rows.
    first = _stage(tmp_path).files(0)
    first.write(_batch([1, 2, 3]))
    assert first.close() == 3
    again = _stage(tmp_path).files(0)
    again.write(_batch([1, 2, 3]))
    assert again.close() == 3
    failed = _stage(tmp_path).files(1)
    failed.write(_batch([4, 5]))
    failed._flush()  # noqa: SLF001 - the file is open, as in a task that fails after its first row group
    assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    failed.abort()
    empty = _stage(tmp_path).files(2)
    empty.write(_batch([]))
    assert empty.close() == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part-00000.parquet"]
    assert pq.read_table(tmp_path / "part-00000.parquet").num_rows == 3


def test_a_table_holding_values_is_not_staged_from_arrow(tmp_path):
    # Catches the Arrow stage taken for a table whose values Spark's writer must bound page by page.
    from resources.delta_store import DeltaStore
    from schemas.registry import struct_for

    with pytest.raises(ValueError, match="holds values"):
        DeltaStore(warehouse_root=str(tmp_path)).arrow_stage("raw_topic_snapshots", "s", struct_for("raw_topic_snapshots"))


def test_the_driver_s_file_sits_beside_the_tasks_files_under_its_own_name(tmp_path):
    # Catches the driver's file (the replica state's contexts) written under a task's name, where it would replace
    # that task's rows (the comparison on the driver is task 0), and a name that could collide with a task's.
    task = _stage(tmp_path).files(0)
    task.write(_batch([1, 2]))
    task.close()
    driver = _stage(tmp_path).files(0, name="contexts")
    driver.write(_batch([3]))
    assert driver.close() == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["contexts.parquet", "part-00000.parquet"]
    with pytest.raises(ValueError, match="tasks' files"):
        _stage(tmp_path).files(0, name="part-00001")


def test_a_table_s_legacy_value_column_is_staged_from_arrow_only_while_null(tmp_path):
    # Catches replica_state refused (its value column is kept for states written before, and new rows leave it
    # null), and a value written into that column anyway (Spark's writer would have bounded its pages).
    from resources.delta_store import DeltaStore
    from schemas.registry import struct_for

    stage = DeltaStore(warehouse_root=str(tmp_path)).arrow_stage("replica_state", "s", struct_for("replica_state"))
    assert stage.null_columns == ("value",)
    rows = {f.name: pa.nulls(1, f.type) for f in stage.schema}
    file = stage.files(0)
    file.write(pa.RecordBatch.from_pydict({**rows, "row_kind": pa.array(["VERSION"])}))
    with pytest.raises(ValueError, match="value must be null"):
        file.write(pa.RecordBatch.from_pydict({**rows, "value": pa.array(["a value"])}))
    file.abort()


def test_each_file_counts_the_rows_breaking_each_rule_and_the_stage_adds_them_up(tmp_path):
    # Catches rule counts lost for rows written in an earlier row group or in another task's file, counts read from
    # the wrong rule, and a file without counts (a writer that skipped them) taken for a file with none broken.
    from resources.delta_store import DeltaStore
    from schemas.arrow_rules import NOT_NULLABLE, ArrowRule
    from schemas.registry import struct_for

    import resources.staged_files as staged_files

    store = DeltaStore(warehouse_root=str(tmp_path))
    rules = (ArrowRule("offset", "greater_than_or_equal_to", (("min_value", 0),)), ArrowRule("key", NOT_NULLABLE))
    stage = store.arrow_stage("reconstructed_watermarks", "s", struct_for("reconstructed_watermarks"), rules)
    full = {name: [None] * 3 for name in stage.schema.names}
    for part, offsets in enumerate(([-1, 2, -3], [4, -5, 6])):
        file = stage.files(part)
        file.write(pa.RecordBatch.from_pydict({**full, "offset": offsets, "key": ["k", None, None]}, schema=stage.schema))
        file.close()
    staged = store.stage_arrow(stage, struct_for("reconstructed_watermarks"))
    assert staged.row_count == 6 and staged.metrics["rule_counts"] == [3, 4]

    bare = staged_files.ArrowStage(**{**stage.__dict__, "rules": ()})
    file = bare.files(2)
    file.write(pa.RecordBatch.from_pydict({**full, "offset": [1, 2, 3]}, schema=stage.schema))
    file.close()
    with pytest.raises(ValueError, match="no rule counts"):
        store.stage_arrow(stage, struct_for("reconstructed_watermarks"))


def test_a_rule_on_the_partition_column_counts_every_row_or_none():
    # Catches a rule on the partition column (absent from the files: the folder names it) skipped, or counted once
    # instead of once per row.
    from schemas.arrow_rules import NOT_NULLABLE, ArrowRule, violations

    rules = (ArrowRule("snapshot_id", NOT_NULLABLE), ArrowRule("snapshot_id", "isin", (("allowed_values", ["a"]),)))
    rows = _batch([1, 2, 3])
    assert violations(rules, rows, {"snapshot_id": "a"}) == [0, 0]
    assert violations(rules, rows, {"snapshot_id": "b"}) == [0, 3]
    assert violations(rules[:1], rows, {"snapshot_id": None}) == [3]
