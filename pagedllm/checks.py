"""Type tests the input checks share. Python's bool is an int, and True read as 1 (a block size, a token id,
a seed) is a mistake to refuse, not a value."""


def is_int(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)
