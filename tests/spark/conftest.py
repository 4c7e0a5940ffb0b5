"""Fixtures of the Spark engine's tests: one local[2] session per module (a process holds one
Spark context at a time: the standalone-cluster tests start their own), and a feature table."""
import shutil

import pytest

pytest.importorskip("pyspark")
if shutil.which("java") is None:
    pytest.skip("the Spark engine's tests need Java 17 (apt-get install openjdk-17-jre-headless)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def spark():
    from wavetrain.spark.session import SparkSettings, spark_session

    with spark_session(SparkSettings("local[2]")) as session:
        yield session


@pytest.fixture
def job(spark, tmp_path):
    from wavetrain.spark.engine import SparkEngine
    from wavetrain.spark.table import FeatureTable

    return SparkEngine(spark, FeatureTable(str(tmp_path / "table")))
