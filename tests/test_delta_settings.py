"""The one decision of the Delta engine and its jar folder (resources/settings.py), without Spark."""
from __future__ import annotations

import pytest

from resources import settings
from resources.errors import InvalidSetting
from resources.settings import delta_settings


@pytest.fixture()
def jars(tmp_path):
    folder = tmp_path / "delta"
    folder.mkdir()
    (folder / "delta-spark_2.13-4.4.0.jar").write_bytes(b"")
    (folder / "delta-storage-4.4.0.jar").write_bytes(b"")
    return str(folder)


def test_unset_settings_find_the_project_folder_and_keep_the_embedded_engine(jars, monkeypatch):
    """Catches: the folder the set-up fills not found when nothing is set, and an audit of no engine setting
    switched to delta-spark (slower, and without the embedded engine's fast paths) because the jars exist."""
    monkeypatch.setattr(settings, "PROJECT_DELTA_JARS", jars)
    chosen = delta_settings(None, None)
    assert chosen.engine == "embedded" and chosen.jars_dir is None and chosen.found_jars_dir == jars
    native = delta_settings(None, "native")
    assert native.engine == "native" and native.jars_dir == jars
    assert delta_settings(None, " AUTO ").jars_dir == jars


def test_a_named_folder_asks_for_delta_spark_and_an_empty_one_for_none(jars, tmp_path, monkeypatch):
    """Catches: a jar folder named explicitly (as before the default existed) no longer giving delta-spark where it
    loads, an explicit empty value taken for "unset" (the project folder loaded anyway), and a project folder
    without delta-spark taken for one."""
    monkeypatch.setattr(settings, "PROJECT_DELTA_JARS", str(tmp_path / "absent"))
    assert delta_settings(None, None).found_jars_dir is None
    named = delta_settings(jars, None)
    assert named.engine == "auto" and named.jars_dir == jars
    monkeypatch.setattr(settings, "PROJECT_DELTA_JARS", jars)
    empty = delta_settings("", None)
    assert empty.engine == "embedded" and empty.jars_dir is None and empty.found_jars_dir is None
    assert delta_settings(jars, "embedded").jars_dir is None  # embedded: the JVM starts without them


def test_an_unknown_engine_is_refused_by_name():
    """Catches: a misspelt engine silently taken for the default."""
    with pytest.raises(InvalidSetting, match="REPLICA_LENS_DELTA_ENGINE must be one of embedded, native, auto"):
        delta_settings(None, "nativ")


def test_jars_given_beside_the_delta_jars_join_them(jars, tmp_path):
    """Catches the suite's (or a user's) ``spark.jars`` in ``extra`` replacing the Delta jars, or the Delta
    jars replacing them: one session needs both, delta-spark and Spark's Kafka source."""
    from resources.session import spark_config

    kafka = str(tmp_path / "spark-sql-kafka.jar")
    conf = spark_config(delta_jars_dir=str(jars), extra={"spark.jars": kafka})
    loaded = conf["spark.jars"].split(",")
    assert kafka in loaded and any("delta-spark" in jar for jar in loaded), loaded
    assert conf["spark.sql.extensions"]
    assert spark_config(extra={"spark.jars": kafka})["spark.jars"] == kafka
