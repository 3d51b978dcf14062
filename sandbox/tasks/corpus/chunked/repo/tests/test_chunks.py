import pytest

from iterkit.chunks import chunked


def test_partial_last_chunk():
    assert chunked([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert chunked([1], 3) == [[1]]


def test_exact_chunks():
    assert chunked([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]


def test_bad_size():
    with pytest.raises(ValueError):
        chunked([1], 0)
