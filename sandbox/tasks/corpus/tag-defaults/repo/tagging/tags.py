def add_tag(tag, tags=[]):
    """Return tags with tag appended (a new list when tags is not given)."""
    tags.append(tag)
    return tags
