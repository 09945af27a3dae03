"""What an audit materializes (``replica-lens audit --scope``, a watched store's ``audit_scope``).

``all``: every per-snapshot asset of the audit job. ``divergence``: the divergence step and every asset it reads
(the ingest, the stream pass, the broker cuts), with their checks; replication lag and the exporter tables are
not computed and hold no row of the snapshot. Those tables carry nothing from one snapshot to the next, so a chain
of ``divergence`` audits proves exactly what a chain of whole ones proves, and any snapshot of it can be audited
whole later (a re-materialization writes the same divergence tables). No Dagster import here: the command line
reads the names.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import dagster as dg

ALL = "all"
DIVERGENCE = "divergence"
AUDIT_SCOPES = (ALL, DIVERGENCE)


def audit_selection(job: "dg.JobDefinition", scope: str) -> Optional[frozenset["dg.AssetKey"]]:
    """The asset keys of ``job`` that an audit of ``scope`` materializes (None: all of them)."""
    import dagster as dg

    from resources.errors import UsageError

    if scope not in AUDIT_SCOPES:
        raise UsageError(f"unknown audit scope {scope!r}: one of {', '.join(AUDIT_SCOPES)}")
    if scope == ALL:
        return None
    # A multi-asset step writes all its tables or none: the stream pass and the ingest come whole.
    selection = dg.AssetSelection.assets("divergence_reports").upstream().required_multi_asset_neighbors()
    return frozenset(selection.resolve(job.asset_layer.asset_graph))
