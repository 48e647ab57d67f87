"""Rich arguments and results: datetime (with its zone), date, time, Decimal, UUID, bytes and
tuples travel as tagged JSON (jobqueue.payload's docstring is the wire format) and come back
as the same types, whatever the task's annotations; plain JSON is stored as it always was."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from jobqueue import JobQueue
from jobqueue.errors import PayloadError
from jobqueue.payload import decode_payload, decode_result, encode_payload, encode_result
from jobqueue.testing import run_due

PARIS = ZoneInfo("Europe/Paris")

RICH = [
    dt.datetime(2026, 11, 29, 6, 30, 0, 250_000, tzinfo=PARIS),
    dt.datetime(2026, 11, 29, 6, 30, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
    dt.datetime(2026, 11, 29, 6, 30, tzinfo=dt.UTC),
    dt.datetime(2026, 11, 29, 6, 30),
    dt.date(2026, 11, 29),
    dt.time(6, 30, 15),
    Decimal("1.10"),
    Decimal("-0E+3"),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    b"\x00\xffbytes",
    (1, "two", (3.0, None)),
]


def round_trip(value: Any) -> Any:
    args, _ = decode_payload(encode_payload([value], {}))
    return args[0]


@pytest.mark.parametrize("value", RICH, ids=lambda v: type(v).__name__)
def test_a_rich_argument_comes_back_equal_and_of_the_same_type(value: Any) -> None:
    back = round_trip(value)
    assert (back, type(back)) == (value, type(value))


def test_a_datetime_keeps_its_zone_and_offset() -> None:
    value = dt.datetime(2026, 3, 29, 3, 30, tzinfo=PARIS)
    back = round_trip(value)
    assert (back.tzinfo, back.utcoffset()) == (PARIS, value.utcoffset())


def test_a_decimal_keeps_its_exact_digits() -> None:
    assert str(round_trip(Decimal("1.10"))) == "1.10"


def test_rich_values_nested_in_lists_dicts_and_keyword_arguments_come_back() -> None:
    kwargs = {"when": {"at": [dt.date(2026, 1, 2), (Decimal("3"),)]}}
    _, back = decode_payload(encode_payload([], kwargs))
    assert back == kwargs and type(back["when"]["at"][1]) is tuple


def test_the_wire_format_is_a_tagged_json_object() -> None:
    text = encode_payload([dt.date(2026, 11, 29), (1, 2)], {"id": uuid.UUID(int=1)})
    assert json.loads(text) == {
        "args": [{"__jq__": ["date", "2026-11-29"]}, {"__jq__": ["tuple", [1, 2]]}],
        "kwargs": {"id": {"__jq__": ["uuid", "00000000-0000-0000-0000-000000000001"]}},
    }


def test_plain_json_is_stored_as_before_and_old_records_read_the_same() -> None:
    old = '{"args":[[1,2],{"at":"2026-01-01T00:00:00Z","n":1.5}],"kwargs":{"k":null}}'
    assert encode_payload([[1, 2], {"at": "2026-01-01T00:00:00Z", "n": 1.5}], {"k": None}) == old
    assert decode_payload(old) == ([[1, 2], {"at": "2026-01-01T00:00:00Z", "n": 1.5}], {"k": None})


def test_a_dict_that_would_read_back_as_a_tag_is_refused() -> None:
    with pytest.raises(PayloadError, match=r"args\[0\].*__jq__"):
        encode_payload([{"__jq__": ["date", "2026-01-01"]}], {})
    with pytest.raises(PayloadError, match="__jq__"):
        encode_payload([], {"__jq__": 1})


def test_a_non_string_dict_key_is_still_refused_naming_where() -> None:
    with pytest.raises(PayloadError, match=r"key 1 \(int\) in args\[0\]\['a'\]"):
        encode_payload([{"a": {1: "x"}}], {})


def test_a_tag_jobqueue_does_not_write_reads_as_the_object_it_is() -> None:
    stored = '{"args":[{"__jq__":["nonsense","x"]},{"__jq__":["date","not a date"]}],"kwargs":{}}'
    assert decode_payload(stored)[0] == [
        {"__jq__": ["nonsense", "x"]},
        {"__jq__": ["date", "not a date"]},
    ]


@pytest.mark.parametrize("value", RICH, ids=lambda v: type(v).__name__)
def test_a_rich_result_comes_back_the_same(value: Any) -> None:
    back = decode_result(encode_result(value))
    assert (back, type(back)) == (value, type(value))


def test_a_task_gets_the_types_it_was_given_and_returns_rich_results(jq: JobQueue) -> None:
    seen: list[Any] = []

    @jq.task
    def invoice(due: dt.date, amount: Decimal, *, key: uuid.UUID, raw: bytes) -> dt.datetime:
        seen.extend([due, amount, key, raw])
        return dt.datetime(2026, 12, 1, 9, 0, tzinfo=PARIS)

    key = uuid.uuid4()
    handle = invoice.enqueue(dt.date(2026, 12, 1), Decimal("990.00"), key=key, raw=b"\x01")
    run_due(jq)
    assert seen == [dt.date(2026, 12, 1), Decimal("990.00"), key, b"\x01"]
    assert handle.refresh().result == dt.datetime(2026, 12, 1, 9, 0, tzinfo=PARIS)
