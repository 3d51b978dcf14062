import re

_UNITS = {"h": 60, "m": 60, "s": 1}
_PART = re.compile(r"(\d+)([hms])")


def parse_duration(text):
    """Parse durations like '1h30m' or '45s' into seconds."""
    if not text or _PART.sub("", text) != "":
        raise ValueError("bad duration: %r" % (text,))
    return sum(int(n) * _UNITS[u] for n, u in _PART.findall(text))
