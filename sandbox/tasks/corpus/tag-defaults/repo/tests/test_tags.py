from tagging.tags import add_tag


def test_calls_do_not_share_state():
    assert add_tag("a") == ["a"]
    assert add_tag("b") == ["b"]


def test_appends_to_given_list():
    tags = ["x"]
    assert add_tag("y", tags) == ["x", "y"]
    assert tags == ["x", "y"]
