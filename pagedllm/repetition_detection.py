"""RepetitionDetectionParams (vLLM's `repetition_detection`): end a completion whose output has come to repeat a
pattern of tokens, as vLLM detects it. After each token, for each pattern size from min_pattern_size (at least 1)
to max_pattern_size, the output's last `size` tokens are compared with the `min_count - 1` runs of `size` tokens
before them; where all are equal the completion ends with finish_reason "repetition" and stop_reason
"repetition_detected". Sizes stop at the first that does not fit `min_count` times in the output. Not before
min_tokens, as a stop token would not."""

from dataclasses import dataclass
from typing import Any

from pagedllm.checks import is_int
from pagedllm.errors import InvalidInputError

# each size is compared after every token: a bound keeps one request from slowing every step (vLLM sets none)
MAX_PATTERN_SIZE = 1024
REPETITION = "repetition"  # the finish reason
REPETITION_DETECTED = "repetition_detected"  # the stop reason


@dataclass(slots=True, frozen=True)
class RepetitionDetectionParams:
    max_pattern_size: int = 0  # 0: detection off
    min_pattern_size: int = 0  # 0: 1
    min_count: int = 0  # repeats that end the output, at least 2 where detection is on

    def __post_init__(self) -> None:
        for name in ("max_pattern_size", "min_pattern_size", "min_count"):
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                raise InvalidInputError(f"repetition_detection.{name} must be an integer >= 0, got {value!r}")
        if self.min_pattern_size > self.max_pattern_size:
            raise InvalidInputError("repetition_detection.min_pattern_size must be <= max_pattern_size (both 0 turns "
                                    f"detection off), got {self.min_pattern_size} > {self.max_pattern_size}")
        if self.max_pattern_size > MAX_PATTERN_SIZE:
            raise InvalidInputError(f"repetition_detection.max_pattern_size must be at most {MAX_PATTERN_SIZE}, got "
                                    f"{self.max_pattern_size}")
        if self.max_pattern_size > 0 and self.min_count < 2:
            raise InvalidInputError("repetition_detection.min_count must be >= 2 where max_pattern_size is set (0 "
                                    f"turns detection off), got {self.min_count}")

    @property
    def enabled(self) -> bool:
        return self.max_pattern_size > 0

    @classmethod
    def from_value(cls, value: "RepetitionDetectionParams | dict[str, Any]") -> "RepetitionDetectionParams":
        """The params themselves, or built from a dict of their fields (as a request body gives them)."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise InvalidInputError(f"repetition_detection must be an object of max_pattern_size, min_pattern_size "
                                    f"and min_count, got {value!r:.80}")
        if unknown := sorted(set(value) - {"max_pattern_size", "min_pattern_size", "min_count"}):
            raise InvalidInputError(f"repetition_detection takes max_pattern_size, min_pattern_size and min_count; "
                                    f"not {unknown}")
        return cls(**value)


def ends_in_repetition(output_ids: list[int], params: RepetitionDetectionParams) -> bool:
    """Whether the output's tail repeats a pattern min_count times (see the module docstring)."""
    if not params.enabled:
        return False
    count = params.min_count
    for size in range(max(params.min_pattern_size, 1), params.max_pattern_size + 1):
        if size * count > len(output_ids):
            return False
        end = len(output_ids)
        tail = output_ids[end - size:]
        if all(output_ids[end - size * (m + 1):end - size * m] == tail for m in range(1, count)):
            return True
    return False
