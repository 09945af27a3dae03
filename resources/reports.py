"""Settings of what the audit shows people beyond its tables: the per-snapshot report page and the UI's pictures.

``redact_values`` keeps every value's text out of the page, the UI metadata and the logs
(``resources/redaction.py``: unset, ``REPLICA_LENS_REDACT_VALUES`` decides). ``pictures``
bounds how many keys of a snapshot's report get a timeline picture (the most important first:
DIVERGENT, MISSING, then IN_FLIGHT); every other key is still explained, in text, with the
command that draws its picture. ``ui_pictures`` is how many of those pictures the
``divergence_reports`` materialization embeds. Each field, unset, is read from the environment
(``REPLICA_LENS_REPORT_PICTURES``, ``REPLICA_LENS_REPORT_UI_PICTURES``), else its default.
"""
from __future__ import annotations

import os
from typing import Optional

import dagster as dg
from pydantic import Field

from resources.settings import whole_number

DEFAULT_PICTURES = 10
DEFAULT_UI_PICTURES = 3
PICTURES_ENV = "REPLICA_LENS_REPORT_PICTURES"
UI_PICTURES_ENV = "REPLICA_LENS_REPORT_UI_PICTURES"


def _count(value: Optional[int], env: str, default: int) -> int:
    if value is not None:
        return value
    found = whole_number(os.environ.get(env), env, minimum=0)
    return default if found is None else found


class ReportSettings(dg.ConfigurableResource):
    """What the audit shows people: the report page, its pictures, redaction."""

    redact_values: Optional[bool] = Field(
        default=None,
        description="Keep every value's text out of pages, UI metadata and logs (hashes only). Unset: "
        "REPLICA_LENS_REDACT_VALUES (1/true/yes/on), else off.",
    )
    pictures: Optional[int] = Field(
        default=None, ge=0,
        description="Keys of a snapshot's report page drawn as timeline pictures, the most important first; the "
        f"others are explained in text with the command that draws theirs. Unset: {PICTURES_ENV}, else "
        f"{DEFAULT_PICTURES}.",
    )
    ui_pictures: Optional[int] = Field(
        default=None, ge=0,
        description=f"Timeline pictures embedded in the divergence_reports materialization. Unset: {UI_PICTURES_ENV}, "
        f"else {DEFAULT_UI_PICTURES}.",
    )

    def redacting(self) -> bool:
        from resources.redaction import redacting

        return redacting(self.redact_values)

    def page_pictures(self) -> int:
        return _count(self.pictures, PICTURES_ENV, DEFAULT_PICTURES)

    def embedded_pictures(self) -> int:
        return _count(self.ui_pictures, UI_PICTURES_ENV, DEFAULT_UI_PICTURES)
