"""Raw Venice version-topic records -> SPEC 1 rows: the Venice decoder, by concern.

- ``protocol``: Venice's KafkaMessageEnvelope wire schemas (protocol versions 10 to 14);
- ``values``: how a store version writes its values (compression, chunking, the push settings
  that say which), decompression bounded by ``Limits``;
- ``decoder``: one record on the wire -> one SPEC 1 row or an outcome (pure functions, run on
  the executors);
- ``frame``: the Spark side: the Kafka-source columns of a snapshot's Parquet files decoded on
  the executors (``mapInArrow``), chunks reassembled, records skipped by rule named;
- ``push_settings``: the push settings file, and the settings carried from an earlier snapshot's
  START_OF_PUSH, for topics a snapshot holds no START_OF_PUSH of;
- ``kafka_dump``: ``replica-lens dump-kafka``, version topics read from brokers into a snapshot.

docs/venice-input.md is the user's side of all this.
"""
