"""Tags in a growing text: how much of its end may yet become a tag (so a stream holds it back)."""


def partial_tag_overlap(text: str, tag: str) -> int:
    """The length of the longest ending of `text` that begins `tag` (and is shorter than it)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0
