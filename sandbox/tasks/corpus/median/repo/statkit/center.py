def median(values):
    """Return the median of a non-empty sequence of numbers."""
    if not values:
        raise ValueError("median of empty data")
    s = sorted(values)
    return s[len(s) // 2]
