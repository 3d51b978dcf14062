def median(values):
    """Return the median of a non-empty sequence of numbers."""
    if not values:
        raise ValueError("median of empty data")
    s = sorted(values)
    mid = len(s) // 2
    if len(s) % 2:
        return s[mid]
    return (s[mid - 1] + s[mid]) / 2
