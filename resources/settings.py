"""Settings given as text (environment variables): one parser for whole numbers, with the rule in the error; the
Delta engine and its jar folder (``delta_settings``)."""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Optional

from resources.errors import InvalidSetting


def whole_number(text: Optional[str], name: str, minimum: int) -> Optional[int]:
    """``text`` as a whole number of at least ``minimum``; empty or None -> None (the caller's default)."""
    if text is None or not text.strip():
        return None
    try:
        value = int(text.strip())
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise InvalidSetting(f"{name} must be a whole number of at least {minimum}, got {text!r}")
    return value


# ---------------------------------------------------------------------------------------- Delta Lake
DELTA_JARS_ENV = "REPLICA_LENS_DELTA_JARS"
DELTA_ENGINE_ENV = "REPLICA_LENS_DELTA_ENGINE"
DELTA_ENGINES = ("embedded", "native", "auto")
# Where ./scripts/setup-jvm.sh puts delta-spark and what it needs beside Spark (jvm/pom.xml, profile delta).
PROJECT_DELTA_JARS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jvm", "lib", "delta")


def has_delta_spark(folder: Optional[str]) -> bool:
    """Whether ``folder`` holds a ``delta-spark`` jar."""
    return bool(folder) and bool(glob.glob(os.path.join(folder, "delta-spark*.jar")))


@dataclass(frozen=True)
class DeltaSettings:
    """Which Delta engine the audit asks for, and the jar folder its Spark session loads (None: none)."""

    engine: str  # embedded, native or auto (DeltaStore.engine)
    jars_dir: Optional[str]
    found_jars_dir: Optional[str]  # the folder the setting names or defaults to, loaded or not


def delta_settings(jars: Optional[str], engine: Optional[str]) -> DeltaSettings:
    """The one decision of the Delta engine and its jars, from ``REPLICA_LENS_DELTA_JARS`` and ``REPLICA_LENS_DELTA_ENGINE``
    (or ``--delta-jars`` and ``--delta-engine``); None: not set.

    The jar folder: as given; empty: none; not set: the project's ``jvm/lib/delta`` when it holds delta-spark.
    The engine: as given; not set: ``auto`` (delta-spark where its jars are loaded) when a jar folder was named,
    else ``embedded`` (measured faster, and its fast paths need it: docs/cluster.md). The jars are loaded only for
    an engine that may use them: an embedded audit's JVM starts as without them.
    """
    text = None if engine is None or not engine.strip() else engine.strip().lower()
    if text is not None and text not in DELTA_ENGINES:
        raise InvalidSetting(f"{DELTA_ENGINE_ENV} must be one of {', '.join(DELTA_ENGINES)}, got {engine!r}")
    named = jars is not None and bool(jars.strip())
    if jars is None:
        folder = PROJECT_DELTA_JARS if has_delta_spark(PROJECT_DELTA_JARS) else None
    else:
        folder = jars.strip() or None
    chosen = text or ("auto" if named else "embedded")
    # (native without a jar folder: a cluster whose Spark has delta-spark configured; the store refuses it otherwise.)
    return DeltaSettings(engine=chosen, jars_dir=None if chosen == "embedded" else folder, found_jars_dir=folder)


def delta_settings_from_environment() -> DeltaSettings:
    return delta_settings(os.environ.get(DELTA_JARS_ENV), os.environ.get(DELTA_ENGINE_ENV))
