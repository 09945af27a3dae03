"""The steps of an audit run and the table each reads its rows from (imports nothing: the benchmark's essential pass loads it)."""

# Asset step -> the table it reads (None: the landing files).
STEP_INPUTS = {
    "raw_topic_snapshots": None,
    "stream_pass": "raw_topic_snapshots",
    "divergence_reports": "reconstructed_watermarks",
    "replication_lag": "raw_topic_snapshots",
    "exporter_tables": "raw_topic_snapshots",
    "broker_cuts": None,  # the snapshot's _cut.json (no rows of a file snapshot: its table is empty)
}
