"""Settings of a simulation run: pool size, model length and the policies to compare."""

from dataclasses import dataclass

from pagedllm.errors import InvalidInputError

DEFAULT_POOL_SLOTS = 32768  # 16 max-length (2048) reservations
DEFAULT_BLOCK_SIZES = (1, 4, 16, 64, 256)
DEFAULT_PREFIX_BLOCK_SIZE = 16
MAX_POSITIONS = 1 << 20  # positions fit the low 20 bits of a synthetic token id
MAX_POOL_SLOTS = 1 << 24  # a pool of blocks of 1 is a list of this many free blocks


@dataclass(slots=True)
class SimConfig:
    pool_slots: int = DEFAULT_POOL_SLOTS
    max_len: int = 2048
    block_sizes: tuple[int, ...] = DEFAULT_BLOCK_SIZES
    prefix_block_size: int | None = DEFAULT_PREFIX_BLOCK_SIZE  # None: no prefix-sharing policy
    contiguous: tuple[str, ...] = ("max_len", "exact")

    def __post_init__(self) -> None:
        if not 2 <= self.max_len <= MAX_POSITIONS:
            raise InvalidInputError(f"max-len must lie in [2, {MAX_POSITIONS}], got {self.max_len}")
        if self.pool_slots > MAX_POOL_SLOTS:
            raise InvalidInputError(f"pool-slots must be at most {MAX_POOL_SLOTS}, got {self.pool_slots}")
        if self.pool_slots < self.max_len:
            raise InvalidInputError(
                f"pool of {self.pool_slots} slots cannot hold one max-length ({self.max_len}) request")
        sizes = list(self.block_sizes) + ([self.prefix_block_size] if self.prefix_block_size is not None else [])
        for b in sizes:
            if b <= 0:
                raise InvalidInputError(f"block size must be positive, got {b}")
            if self.pool_slots % b:
                raise InvalidInputError(f"pool of {self.pool_slots} slots is not a whole number of {b}-slot blocks")

    def policy_names(self) -> list[str]:
        names = [f"contig-{'max' if c == 'max_len' else c}" for c in self.contiguous]
        names += [f"paged-{b}" for b in self.block_sizes]
        if self.prefix_block_size is not None:
            names.append(f"prefix-{self.prefix_block_size}")
        return names
