from collections.abc import Iterable


def flatten(items):
    """Flatten arbitrarily nested iterables into one list."""
    out = []
    for item in items:
        if isinstance(item, Iterable) and not isinstance(item, (str, bytes)):
            out.extend(flatten(item))
        else:
            out.append(item)
    return out
