import re
from collections import Counter


def word_counts(text):
    """Count the words of text, ignoring punctuation; keys are lower case."""
    return dict(Counter(w.lower() for w in re.findall(r"[A-Za-z']+", text)))
