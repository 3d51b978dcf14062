import pytest

from roman.convert import to_roman


def test_ninety():
    assert to_roman(90) == "XC"
    assert to_roman(1994) == "MCMXCIV"


def test_small_numbers():
    assert [to_roman(i) for i in (1, 4, 9, 14)] == ["I", "IV", "IX", "XIV"]


def test_range_checked():
    with pytest.raises(ValueError):
        to_roman(0)
