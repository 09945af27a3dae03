"""The one setting that keeps values' text out of everything shown: explanations, pages, UI metadata, logs.

Member data lives in these stores. With redaction on, a value is shown by its hash only
(sha256, as the tables compare it): ``replica-lens explain`` and ``audit`` (``--redact-values``),
the Dagster ``reports`` resource (``redact_values``) and ``REPLICA_LENS_REDACT_VALUES`` all
resolve through ``redacting`` here. An explicit setting wins over the environment.
"""
from __future__ import annotations

import os
from typing import Optional

from resources.errors import InvalidSetting

REDACT_ENV = "REPLICA_LENS_REDACT_VALUES"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def redacting(explicit: Optional[bool] = None) -> bool:
    """Whether values are redacted: ``explicit`` when given, else ``REPLICA_LENS_REDACT_VALUES`` (default off)."""
    if explicit is not None:
        return explicit
    text = os.environ.get(REDACT_ENV, "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InvalidSetting(f"{REDACT_ENV} must be one of 1/true/yes/on or 0/false/no/off, got {text!r}")
