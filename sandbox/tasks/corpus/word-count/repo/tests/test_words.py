from textstats.words import word_counts


def test_case_insensitive():
    assert word_counts("The cat saw the dog") == {"the": 2, "cat": 1, "saw": 1, "dog": 1}


def test_punctuation_ignored():
    assert word_counts("dog, dog; cat!") == {"dog": 2, "cat": 1}
