"""The state an incremental audit carries from one snapshot of a stream to the next, by concern.

- ``rows``: the rows of ``replica_state`` (each key's last version, one commit context per
  replica partition) and the checksum a context keeps of them;
- ``arrow_checksum``: that checksum counted on Arrow rows, as the comparison's pass writes the
  VERSION rows itself (equal to Spark's ``xxhash64``);
- ``prior``: which state a snapshot continues (the predecessor rule), checked and verified, and
  which states are kept (retention);
- ``check`` and ``overlap``: the commit-context check of a carried state, and the verification of
  a dump's overlap with the state it continues;
- ``settled``: the carried keys a small cut leaves out of its comparison (their verdict cannot
  change), in the one read of the state that also counts it for the check;
- ``absent``: the replica partitions a broker cut lists without rows in the snapshot, compared on
  their carried state (SPEC 11) and not written again;
- ``carry``: what the divergence stage does with it: ``carry_over`` continues a snapshot's
  watermarks from the state it continues, ``next_state`` builds the state after it (Spark's
  way; the audit has the comparison's pass write the VERSION rows and adds the contexts with
  ``contexts_from_sums``).

docs/incremental.md is the user's side of all this.
"""
