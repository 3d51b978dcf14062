from textkit.slug import slugify


def test_collapses_runs_and_trims():
    assert slugify("Hello,  World!") == "hello-world"
    assert slugify("  --Go 1.26 --  ") == "go-1-26"


def test_simple_word():
    assert slugify("Flywheel") == "flywheel"
