"""The SparkSession the pipeline's jobs and tests use, with the ``kcoord`` source registered.

``local[2]`` is the embedded default; any master URL (``spark://host:7077``, ``yarn``, ...)
runs the same job on a cluster, whose workers then need this package installed (README).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import SparkSession

from kcoord.pipeline.source import KcoordDataSource, default_pyspark_python

DEFAULT_MASTER = "local[2]"

# Small defaults for a 2-core machine: few shuffle partitions (Spark's 200 would schedule 200
# tiny tasks per stateful micro-batch), no UI port, state in memory (HDFS-backed provider).
DEFAULT_CONF: Mapping[str, str] = {
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "1g",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    "spark.python.worker.reuse": "true",
}


def build_session(
    app_name: str, master: str = DEFAULT_MASTER, conf: Mapping[str, str] | None = None
) -> SparkSession:
    default_pyspark_python()
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(KcoordDataSource)
    return spark
