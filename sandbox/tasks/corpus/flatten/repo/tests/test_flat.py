from nestkit.flat import flatten


def test_strings_are_atoms():
    assert flatten(["ab", ["c", [b"d"]]]) == ["ab", "c", b"d"]


def test_nested_lists():
    assert flatten([1, [2, [3, (4,)]], []]) == [1, 2, 3, 4]
