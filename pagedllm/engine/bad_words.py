"""Bad words (`SamplingParams.bad_words`): token sequences a completion may never produce, banned as vLLM bans them.

Each word is tokenized twice, as it reads at the start of a text and after a space (" word"). The second
spelling is banned too where it starts with another token and has as many tokens as the first (where the
space merely adds a token in front, it is not). While a sampled sequence's output ends with all but the last
token of a spelling, that last token gets -inf before the pick, so a one-token spelling is never sampled.
Only the output counts, not the prompt; logprobs stay the model's own.
"""

from typing import Any

import torch

from pagedllm.engine.device import to_device
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import MAX_BAD_WORDS


def bad_word_spellings(tokenizer: Any, words: list[str], vocab_size: int) -> list[list[int]]:
    """The token sequences to ban for `words` (see the module docstring)."""
    spellings: list[list[int]] = []
    for word in words:
        plain, spaced = (_encode(tokenizer, prefix + word.lstrip()) for prefix in ("", " "))
        if not plain:
            raise InvalidInputError(f"bad_words entries must tokenize to at least one token, got {word!r}")
        spellings.append(plain)
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            spellings.append(spaced)
    if len(spellings) > MAX_BAD_WORDS:
        raise InvalidInputError(f"bad_words give {len(spellings)} token sequences, at most {MAX_BAD_WORDS} are taken")
    if outside := [t for spelling in spellings for t in spelling if t >= vocab_size]:
        raise InvalidInputError(f"bad_words tokenize to ids past the model's vocabulary of {vocab_size}: {outside[:3]}")
    return spellings


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def banned_tokens(spellings: list[list[int]], output_ids: list[int]) -> list[int]:
    """The tokens that would complete a spelling right after `output_ids`."""
    return [s[-1] for s in spellings if _ends_with(output_ids, s[:-1])]


def _ends_with(ids: list[int], tail: list[int]) -> bool:
    return not tail or ids[len(ids) - len(tail) :] == tail


def ban_bad_words(logits: torch.Tensor, spellings: list[list[list[int]]], outputs: list[list[int]]) -> torch.Tensor:
    """-inf, in place, for each row's tokens that would complete one of its spellings after its output."""
    cells = [(i, token) for i, (row_spellings, output) in enumerate(zip(spellings, outputs))
             for token in banned_tokens(row_spellings, output)]  # fmt: skip
    if cells:
        index = to_device(torch.tensor(cells, dtype=torch.long), logits.device, "bad words")
        logits[index[:, 0], index[:, 1]] = float("-inf")
    return logits
