"""`python -m pagedllm.kernels`: build the compiled CPU kernels now (make install does), say where or why not."""

import logging
import sys

from pagedllm.errors import InvalidInputError
from pagedllm.kernels.build import build_cpu_kernels, cpu_isa


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        module = build_cpu_kernels()
    except InvalidInputError as exc:  # a misspelt environment switch
        print(f"error: {exc}", file=sys.stderr)
        return 2
    isa = cpu_isa()
    if module is None:
        print(f"compiled CPU kernels unavailable (CPU flags: {' '.join(isa) or 'none'}); the torch path will be used")
        return 0
    print(f"compiled CPU kernels ready: {module.__file__} (CPU flags: {' '.join(isa)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
