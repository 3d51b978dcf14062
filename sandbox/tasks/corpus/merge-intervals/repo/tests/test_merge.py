from intervals.merge import merge_intervals


def test_touching_intervals_merge():
    assert merge_intervals([(1, 2), (2, 3)]) == [(1, 3)]
    assert merge_intervals([(5, 6), (1, 5)]) == [(1, 6)]


def test_overlapping():
    assert merge_intervals([(1, 4), (2, 6), (8, 9)]) == [(1, 6), (8, 9)]


def test_disjoint_and_empty():
    assert merge_intervals([(3, 4), (1, 2)]) == [(1, 2), (3, 4)]
    assert merge_intervals([]) == []
