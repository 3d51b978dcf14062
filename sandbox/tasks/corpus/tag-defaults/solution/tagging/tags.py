def add_tag(tag, tags=None):
    """Return tags with tag appended (a new list when tags is not given)."""
    if tags is None:
        tags = []
    tags.append(tag)
    return tags
