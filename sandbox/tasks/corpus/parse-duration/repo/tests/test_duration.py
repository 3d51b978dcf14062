import pytest

from timekit.duration import parse_duration


def test_hours():
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2h") == 7200


def test_minutes_and_seconds():
    assert parse_duration("2m5s") == 125


def test_invalid():
    for bad in ("", "5x", "h"):
        with pytest.raises(ValueError):
            parse_duration(bad)
