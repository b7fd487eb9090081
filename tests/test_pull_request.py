"""What a pull is asked: ``PullRequest`` holds the user's request, the source its own values
(``pull_sources``), and ``check_request`` refuses bad values before anything starts."""

from __future__ import annotations

import pytest

from spark_backend.jobs.pull import PullRequest, PullTuning, check_request
from spark_backend.jobs.pull_sources import (
    DemoSource,
    EmulatorSource,
    SpannerSource,
    source_named,
)
from spark_backend.model.errors import BadInput


def test_each_kind_of_source_takes_the_values_it_uses():
    given = dict(project="p", instance="i", database="d", stream="S", dialect="postgresql",
                 seed=3, scale=0.5, seconds=9.0, host="127.0.0.1:1")
    assert source_named("demo", **given) == DemoSource(3, 0.5, "postgresql", "S",
                                                       host="127.0.0.1:1")
    assert source_named("emulator", **given) == EmulatorSource(
        "p", "i", "d", "postgresql", "S", "127.0.0.1:1", 9.0, 3)
    assert source_named("spanner", **given) == SpannerSource("p", "i", "d", "S", "postgresql")


def test_an_unknown_source_is_one_sentence_naming_the_accepted():
    with pytest.raises(BadInput) as said:
        source_named("mysql")
    assert str(said.value) == ("Unknown source 'mysql'; accepted sources are demo, emulator, "
                               "spanner.")
    with pytest.raises(BadInput, match="Unknown source 'demo'"):
        check_request(PullRequest("demo"))  # a name, not a source


@pytest.mark.parametrize("request_, field, words", [
    (PullRequest(DemoSource(scale=99.0)), "demo_scale", "--demo-scale 99.0 is not accepted"),
    (PullRequest(EmulatorSource(seconds=0.0)), "emulator_seconds", "--emulator-seconds 0.0"),
    (PullRequest(SpannerSource("p")), "instance",
     "The spanner source needs --instance, --database, --stream."),
    (PullRequest(DemoSource(), tuning=PullTuning(max_attempts=0)), "max_attempts",
     "max_attempts 0 is not accepted"),
    (PullRequest(DemoSource(dialect="mysql")), "dialect", "mysql"),
    (PullRequest(DemoSource(), start="2026-01-05T10:00:00Z", end="2026-01-05T09:00:00Z"),
     "start", "is after --end"),
], ids=["demo-scale", "emulator-seconds", "spanner-names", "tuning", "dialect", "times"])
def test_bad_values_are_refused_before_anything_starts(request_, field, words):
    with pytest.raises(BadInput) as said:
        check_request(request_)
    assert words in str(said.value) and "\n" not in str(said.value)
    assert said.value.field == field


def test_a_request_has_no_room_for_a_value_it_does_not_take():
    request = PullRequest(SpannerSource("p", "i", "d", "S"))
    with pytest.raises(AttributeError):
        request.dialect = "postgresql"  # the source's: replace it there
    with pytest.raises(AttributeError):
        request.source.dialect = "postgresql"  # frozen: dataclasses.replace
    assert check_request(request).start is None
