"""Spark's Python worker daemon in local mode, importing PySpark from the installed package, not from Spark's zips.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on its Python
workers' ``PYTHONPATH``. Python cannot cache compiled bytecode inside a zip, so the daemon,
and every worker it forks, compiled the PySpark modules it imports from source, every time,
partly on the audit's longest chain of steps (the Leap Frog comparison waits for its first
worker). What this saves is measured in docs/performance.md.

With PySpark from pip, ``SPARK_HOME`` is the installed package's folder and the zips lie
inside it: the same code is importable from the package, with its cached bytecode. This
module runs as ``python -m resources.pyspark_daemon pyspark.worker`` (Spark's
``spark.python.daemon.module``, set by ``resources/session.py`` only in local mode and when
the workers run the session's own interpreter: a cluster's executors, or another Python
chosen for the workers, need not have this project installed). It drops the zips from
``sys.path`` when they belong to the PySpark package the rest of the path finds, then runs
PySpark's own daemon unchanged. With a separate Spark distribution the zips are not inside
that package, and the path is left as it is.
"""
from __future__ import annotations

import importlib.machinery
import os
import runpy
import sys

ZIP_PREFIXES = ("pyspark", "py4j")


def zips_inside_installed_pyspark(path: list[str]) -> list[str]:
    """The entries of ``path`` that are Spark's Python zips inside the PySpark package the other entries find.

    Empty when there is no such zip, when the other entries find no PySpark, or when any of
    the zips lies outside that package (a Spark distribution of its own, maybe of another
    version: its zips must stay).
    """
    zips = [e for e in path if e.endswith(".zip") and os.path.basename(e).startswith(ZIP_PREFIXES)]
    if not zips:
        return []
    spec = importlib.machinery.PathFinder.find_spec("pyspark", [e for e in path if e not in zips])
    if spec is None or not spec.submodule_search_locations:
        return []
    package = os.path.realpath(next(iter(spec.submodule_search_locations)))
    if all(os.path.realpath(e).startswith(package + os.sep) for e in zips):
        return zips
    return []


def main() -> None:
    dropped = set(zips_inside_installed_pyspark(sys.path))
    sys.path[:] = [entry for entry in sys.path if entry not in dropped]
    # PySpark's daemon reads the worker module from sys.argv[1], as when Spark starts it itself.
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
