"""Settings of what the audit shows people beyond its tables: the per-snapshot report page and the UI's pictures.

``redact_values`` keeps every value's text out of the page, the UI metadata and the logs
(``replica_lens/explain/redaction.py``: unset, ``REPLICA_LENS_REDACT_VALUES`` decides).
``pictures`` bounds how many keys of a snapshot's report get a timeline picture (the most
important first: DIVERGENT, MISSING, then IN_FLIGHT); every other key is still explained, in
text, with the command that draws its picture. ``ui_pictures`` is how many of those pictures
the ``divergence_reports`` materialization embeds.
"""
from __future__ import annotations

from typing import Optional

import dagster as dg
from pydantic import Field

DEFAULT_PICTURES = 10
DEFAULT_UI_PICTURES = 3


class ReportSettings(dg.ConfigurableResource):
    """What the audit shows people: the report page, its pictures, redaction."""

    redact_values: Optional[bool] = Field(
        default=None,
        description="Keep every value's text out of pages, UI metadata and logs (hashes only). Unset: "
        "REPLICA_LENS_REDACT_VALUES (1/true/yes/on), else off.",
    )
    pictures: int = Field(
        default=DEFAULT_PICTURES, ge=0,
        description="Keys of a snapshot's report page drawn as timeline pictures, the most important first; the "
        "others are explained in text with the command that draws theirs.",
    )
    ui_pictures: int = Field(
        default=DEFAULT_UI_PICTURES, ge=0,
        description="Timeline pictures embedded in the divergence_reports materialization.",
    )

    def redacting(self) -> bool:
        from replica_lens.explain.redaction import redacting

        return redacting(self.redact_values)
