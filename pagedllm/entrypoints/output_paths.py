"""Report and picture paths from a command line, checked before the work whose results they hold."""

import argparse
from pathlib import Path

from pagedllm.errors import InvalidInputError


def check_output_paths(args: argparse.Namespace, options: tuple[str, ...], pictures: tuple[str, ...] = ()) -> None:
    """Each given path (but "-", standard output) names a file in an existing folder; `pictures` end in .png."""
    for option in options:
        path = getattr(args, option, None)
        if path is None or path == "-":
            continue
        flag = "--" + option.replace("_", "-")
        if not path.strip():
            raise InvalidInputError(f"{flag} needs a path, not an empty string")
        folder = Path(path).expanduser().parent
        if not folder.is_dir():
            raise InvalidInputError(f"{flag} {path}: no folder {folder} to write it in")
        if option in pictures and Path(path).suffix.lower() != ".png":
            raise InvalidInputError(f"{flag} {path}: pictures are written as PNG; name a .png file")
