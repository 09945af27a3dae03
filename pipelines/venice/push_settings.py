"""Configured Venice push settings: compression and chunking of version topics a snapshot holds no START_OF_PUSH of.

Every partition of a version topic starts with a START_OF_PUSH that declares how its values are
written (``pipelines/venice/values.py``). A dump that starts later (a mid-stream or continuing dump)
lacks it; then the settings come from another partition's START_OF_PUSH in the same snapshot, else from
this file, else from the START_OF_PUSH of an earlier snapshot of the warehouse, else the topic is not audited
and is named (docs/venice-input.md). The file is JSON, one entry per
version topic::

    {
      "store_v3": {"compression": "GZIP", "chunked": true},
      "orders_v7": {"compression": "ZSTD_WITH_DICT", "dictionary_file": "orders_v7.dict"},
      "users_v2": {"compression": "NO_OP"}
    }

``compression`` is Venice's name of the strategy (NO_OP, GZIP, ZSTD, ZSTD_WITH_DICT; any case);
``chunked`` defaults to false. ZSTD_WITH_DICT needs the dictionary: ``dictionary_file`` (a path,
relative to the JSON file) or ``dictionary_base64``. A START_OF_PUSH in the snapshot wins over the file, the file over
earlier snapshots.
"""
from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path

from pipelines.venice.values import COMPRESSION_NAMES, ZSTD_WITH_DICT, PushSettings
from resources.errors import InvalidSetting

_BY_NAME = {name: number for number, name in COMPRESSION_NAMES.items()}
_FIELDS = {"compression", "chunked", "dictionary_file", "dictionary_base64"}


def parse_push_settings(path: str | None) -> dict[str, PushSettings]:
    """The settings file at ``path`` -> {version topic: PushSettings}; None or empty -> {}. InvalidSetting
    names the file, the topic and what is wrong."""
    if not path:
        return {}
    file = Path(path)
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidSetting(f"Venice push settings {path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise InvalidSetting(f"Venice push settings {path}: not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise InvalidSetting(f"Venice push settings {path}: expected an object of version topic -> settings")
    return {topic: push_settings_entry(entry, f"Venice push settings {path}, topic {topic!r}", file.parent)
            for topic, entry in document.items()}


def push_settings_entry(entry: object, where: str, folder: Path | None = None) -> PushSettings:
    """One topic's entry (``push_settings_document``'s form) -> PushSettings; InvalidSetting says what is wrong.
    ``folder``: where a ``dictionary_file`` is looked for (None: the entry may not name one)."""
    if not isinstance(entry, dict) or set(entry) - _FIELDS:
        raise InvalidSetting(f"{where}: expected an object with only {sorted(_FIELDS)}")
    name = str(entry.get("compression", "NO_OP")).upper()
    if name not in _BY_NAME:
        raise InvalidSetting(f"{where}: compression {entry.get('compression')!r} is not one of {sorted(_BY_NAME)}")
    chunked = entry.get("chunked", False)
    if not isinstance(chunked, bool):
        raise InvalidSetting(f"{where}: chunked must be true or false")
    dictionary = _dictionary(entry, folder, where)
    if _BY_NAME[name] == ZSTD_WITH_DICT and not dictionary:
        raise InvalidSetting(f"{where}: ZSTD_WITH_DICT needs dictionary_file or dictionary_base64")
    return PushSettings(chunked, _BY_NAME[name], dictionary)


def _dictionary(entry: dict, folder: Path | None, where: str) -> bytes | None:
    if "dictionary_file" in entry and folder is not None:
        dict_path = folder / str(entry["dictionary_file"])
        try:
            return dict_path.read_bytes()
        except OSError as exc:
            raise InvalidSetting(f"{where}: cannot read dictionary_file {dict_path} ({exc.strerror or exc})") from None
    if "dictionary_base64" in entry:
        try:
            return base64.b64decode(str(entry["dictionary_base64"]), validate=True)
        except binascii.Error:
            raise InvalidSetting(f"{where}: dictionary_base64 is not base64") from None
    return None


def push_settings_document(settings: dict[str, PushSettings]) -> dict:
    """The JSON document ``parse_push_settings`` reads back as ``settings`` (dictionaries inline, base64)."""
    return {topic: s.as_entry() for topic, s in sorted(settings.items())}


# The extra field of a START_OF_PUSH row of raw_topic_snapshots that keeps what it declared (pipelines/venice/frame.py).
DECLARED_FIELD = "venice_push_settings"


def carried_from_rows(rows: list[tuple[str, str, str]]) -> dict[str, dict[PushSettings, list[str]]]:
    """(snapshot_id, topic, declared JSON) of earlier START_OF_PUSH rows -> topic -> {settings: [snapshot ids]}.
    A declaration that does not parse is left out (an earlier snapshot's row of another version of the project)."""
    out: dict[str, dict[PushSettings, list[str]]] = {}
    for snapshot_id, topic, text in rows:
        try:
            settings = push_settings_entry(json.loads(text), f"snapshot {snapshot_id}, topic {topic!r}")
        except (InvalidSetting, ValueError):
            continue
        ids = out.setdefault(topic, {}).setdefault(settings, [])
        if snapshot_id not in ids:
            ids.append(snapshot_id)
    return out
