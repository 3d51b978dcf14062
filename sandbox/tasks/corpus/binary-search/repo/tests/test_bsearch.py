from searchkit.bsearch import index_of


def test_finds_last_element():
    assert index_of([1, 3, 5], 5) == 2
    assert index_of([7], 7) == 0


def test_finds_first_and_middle():
    assert index_of([1, 3, 5, 7], 1) == 0
    assert index_of([1, 3, 5, 7], 3) == 1


def test_missing():
    assert index_of([1, 3, 5], 4) == -1
    assert index_of([], 1) == -1
