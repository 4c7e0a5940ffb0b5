"""A wavetrain error raised in a task fails the job at once with its one-line message (it would
fail the same way on every attempt); other failures are still retried by Spark."""
import operator
import os
import uuid

import pytest

from wavetrain.core.errors import ParameterError, SpecError, UserError
from wavetrain.spark.jobs import TaskError, checked, on_executor
from wavetrain.spark.passes import merging


@pytest.fixture(scope="module")
def retrying(tmp_path_factory):
    """A local session whose tasks get four attempts (as on a cluster), not local[N]'s one."""
    from wavetrain.spark.session import SparkSettings, spark_session

    with spark_session(SparkSettings("local[2,4]")) as session:
        yield session.sparkContext


def _attempts(folder, i):
    return sum(1 for name in os.listdir(folder) if name.startswith(f"{i}-"))


def test_a_wavetrain_error_in_a_task_is_raised_once_with_its_message(retrying, tmp_path):
    marks = str(tmp_path)

    def task(i):
        with open(os.path.join(marks, f"{i}-{uuid.uuid4().hex}"), "w"):
            pass
        if i == 2:
            raise ParameterError("components=0: expected at least 1", param="components")
        return i

    add = merging(operator.add)
    with pytest.raises(ParameterError, match=r"^components=0: expected at least 1$"):
        checked(retrying.parallelize(range(4), 4).map(on_executor(task)).treeAggregate(None, add, add))
    assert _attempts(marks, 2) == 1                      # not retried
    with pytest.raises(ParameterError):
        checked(retrying.parallelize(range(4), 4).map(on_executor(task)).collect())
    assert _attempts(marks, 2) == 2


def test_a_failure_that_can_pass_on_retry_is_still_retried(retrying, tmp_path):
    marks = str(tmp_path)

    def task(i):
        with open(os.path.join(marks, f"{i}-{uuid.uuid4().hex}"), "w"):
            pass
        if i == 1 and _attempts(marks, 1) == 1:
            raise OSError("connection reset by the shared file system")
        return i

    add = merging(operator.add)
    assert checked(retrying.parallelize(range(3), 3).map(on_executor(task)).treeAggregate(None, add, add)) == 3
    assert _attempts(marks, 1) == 2 and _attempts(marks, 0) == 1


def test_a_spec_error_on_an_executor_reaches_the_driver_as_itself(retrying):
    from wavetrain.features import parse_spec

    out = retrying.parallelize(["mfcc(coeffs=13)", "mfcc(coefs=13"], 2).map(
        on_executor(lambda text: str(parse_spec(text)))).collect()
    assert isinstance(out[1], TaskError) and out[1].kind == "SpecError"
    with pytest.raises(SpecError) as caught:
        checked(out)
    assert "\n" not in str(caught.value)


def test_task_errors_win_every_reduction_and_unknown_kinds_become_user_errors():
    err, add = TaskError("ParameterError", "bad"), merging(operator.add)
    assert add(1, err) is err and add(err, 1) is err and add(None, err) is err
    assert add(err, None) is err and add(None, 2) == 2 and add(1, 2) == 3
    strange = TaskError("SomethingElse", "an error class wavetrain does not define")
    with pytest.raises(UserError, match="does not define"):
        checked(strange)
    assert checked([[1], None]) == [[1], None]
