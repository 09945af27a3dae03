"""Mutated raw Venice records through Spark: a whole dump read, judged and compared, as the audit's stages do.

tests/test_venice_values.py mutates single records in front of the decoder; here the same mutations
(bits flipped, cut short, a length prefix set huge, bytes inserted) and whole records dropped or
delivered twice go into the Parquet files of a simulated compressed and chunked store, which is read
(``read_snapshot_lines``), judged, and compared with Leap Frog, stage by stage without Dagster. For
every mutated dump:

- nothing raises, but the one stop the audit makes on purpose (an upstream cluster id the map lacks:
  a flipped id looks like one), whose error names the id;
- per replica, rows read = accepted + quarantined + skipped, and the rows read are the files' records;
- no key is proven DIVERGENT or MISSING that the dump as written does not prove, unless a record the
  mutation changed still decodes to a row (then the dump states another history, and the audit proves
  from it as from any dump; a row whose source position changed moves the watermarks of every later
  row, so then only the first two properties are checked). A record that is lost (quarantined,
  dropped) only ever costs proofs: its position is a gap (SPEC 3a).
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from pipelines.ingest import VeniceSettings, accounting_from_tables, judge_rows, read_snapshot_lines
from pipelines.leapfrog import compare_replicas
from pipelines.ingest.reading import read_skipped_positions
from pipelines.segments import annotate_segments, summarize_segments
from pipelines.venice.frame import unknown_cluster_id_in
from pipelines.watermarks import partition_watermarks, reconstruct_watermarks
from resources.landing import parse_cluster_regions
from replica_lens.simulator import SimulationConfig, simulate
from tests.examples import examples
from tests.test_venice_values import HUGE_VARINT

PROVEN = ("DIVERGENT", "MISSING")
POSITION = ("replica", "topic", "partition", "offset")
SOURCE = ("kind", "source_region", "source_offset", "hb_vector")


def _audited(spark, folder: Path, venice: VeniceSettings) -> dict:
    """The stages of an audit of ``folder``: accepted rows by position, the accounting, and the proven keys."""
    judgement = judge_rows(read_snapshot_lines(spark, str(folder), venice), "s")
    accepted = judgement.accepted.localCheckpoint()
    skipped = judgement.skipped_by_reason()
    positions = read_skipped_positions(spark, str(folder), "s", venice) if skipped else None
    counts = accounting_from_tables(accepted, judgement.quarantined, skipped, positions)
    annotated = annotate_segments(accepted, positions).localCheckpoint()
    partitions = partition_watermarks(summarize_segments(annotated)).localCheckpoint()
    reports, _ = compare_replicas(reconstruct_watermarks(annotated), partitions)
    proven = {(r["topic"], r["partition"], r["key"], r["replica_a"], r["replica_b"], r["verdict"])
              for r in reports.where(reports.verdict.isin(*PROVEN)).collect()}
    rows = {tuple(r[c] for c in POSITION): r.asDict() for r in accepted.collect()}
    return {"rows": rows, "counts": counts, "proven": proven}


@pytest.fixture(scope="module")
def store(spark, tmp_path_factory):
    """A gzip-compressed, chunked simulated store with a lost write and a corrupted value, and its audit as written."""
    base = tmp_path_factory.mktemp("fuzz")
    config = SimulationConfig(seed=13, regions=2, partitions=1, keys=12, writes=60, file_format="venice-kafka",
                              compression="gzip", chunk_above=24, lost_writes=1, corrupted_values=1)
    summary = simulate(base, "s", config)
    truth = json.loads(Path(summary["ground_truth"]).read_text())["venice"]
    venice = VeniceSettings(parse_cluster_regions(truth["cluster_regions"]), truth["clock_uncertainty_ms"])
    folder = Path(summary["snapshot_dir"])
    return folder, venice, _audited(spark, folder, venice)


def _mutate(table: pa.Table, rng: random.Random, how: str) -> pa.Table:
    i = rng.randrange(table.num_rows)
    if how == "drop":
        return pa.concat_tables([table.slice(0, i), table.slice(i + 1)])
    if how == "twice":
        return pa.concat_tables([table.slice(0, i + 1), table.slice(i)])
    column = rng.choice(["key", "value"])
    cells = table.column(column).to_pylist()
    data = bytearray(cells[i] or b"")
    if how == "flip" and data:
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif how == "truncate":
        del data[rng.randint(0, len(data)):]
    elif how == "huge_length" and data:
        at = rng.randrange(len(data))
        data[at:at + rng.randint(1, 10)] = HUGE_VARINT
    else:  # insert
        at = rng.randint(0, len(data))
        data[at:at] = rng.randbytes(rng.randint(1, 16))
    cells[i] = bytes(data)
    return table.set_column(table.schema.get_field_index(column), column, pa.array(cells, table.schema.field(column).type))


@example(seed=3787, hows=["truncate"])  # a quarantined PUT followed by skipped chunks: its gap was lost, a false proof
@settings(max_examples=examples(1), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), hows=st.lists(
    st.sampled_from(["flip", "truncate", "huge_length", "insert", "drop", "twice"]), min_size=1, max_size=3))
def test_a_mutated_dump_is_audited_accounted_and_proves_nothing_its_records_do_not_state(spark, store, tmp_path, seed,
                                                                                        hows):
    # Catches: a record whose bytes the decoder does not expect stopping the run (and every other topic with it),
    # a mutated record missing from the accounting (read != accepted + quarantined + skipped), and a proof resting on
    # a record the dump lost (a quarantined or dropped record taken for a position the replica never wrote).
    folder, venice, before = store
    dump = tmp_path / f"m{seed}"
    shutil.rmtree(dump, ignore_errors=True)
    shutil.copytree(folder, dump)
    rng = random.Random(seed)
    files = sorted(dump.glob("*.kafka.parquet"))
    for how in hows:
        path = rng.choice(files)
        pq.write_table(_mutate(pq.read_table(path), rng, how), path)
    try:
        after = _audited(spark, dump, venice)
    except Exception as exc:  # noqa: BLE001 - the one stop on purpose is checked, anything else fails the test
        assert unknown_cluster_id_in(exc), f"{hows}: {exc}"
        event("stopped: an upstream cluster id the map lacks")
        return
    counts = after["counts"]
    assert counts["rows_read"] == sum(pq.read_metadata(p).num_rows for p in dump.glob("*.parquet")), hows
    for replica, seen in counts["by_replica"].items():
        assert seen["read"] == seen["accepted"] + seen["quarantined"] + seen.get("skipped", 0), (hows, replica, seen)
    changed = {p for p in set(before["rows"]) | set(after["rows"])
               if p in after["rows"] and before["rows"].get(p) != after["rows"][p]}
    if any(before["rows"].get(p, {}).get(c) != after["rows"][p].get(c) for p in changed for c in SOURCE):
        event("proofs not compared: a row's kind or source changed")
        return  # a row whose kind or source moved: every later watermark of its stream moves with it
    stated = {before["rows"][p]["key"] for p in changed if p in before["rows"]} | {after["rows"][p]["key"] for p in changed}
    new = {proof for proof in after["proven"] - before["proven"] if proof[2] not in stated}
    event(f"proofs compared ({'a changed row decodes' if changed else 'records lost or unchanged'})")
    assert not new, (hows, sorted(new))
