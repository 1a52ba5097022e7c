"""The offline API: `LLM().generate(prompts, SamplingParams(...))`."""

import logging
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import fields
from typing import Any, NamedTuple

from tqdm import tqdm

from pagedllm.checks import is_int
from pagedllm.config import EngineConfig
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.engine.outputs import RequestOutput
from pagedllm.engine.stats import EngineStats
from pagedllm.entrypoints.beam_search import BeamSearchOutput, BeamSearchParams, beam_outputs
from pagedllm.entrypoints.tool_calls import check_tools
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import SamplingParams

# A text, token ids, or vLLM's prompt dicts: {"prompt": text} (TextPrompt), {"prompt_token_ids": ids} (TokensPrompt),
# either with a "cache_salt"; with both "prompt" and "prompt_token_ids" the ids run and the text is shown.
Prompt = str | list[int] | dict[str, Any]
PROMPT_KEYS = ("prompt", "prompt_token_ids", "cache_salt")


# whether to show a progress bar, or (as in vLLM) the tqdm-like class that makes it
Progress = bool | Callable[..., tqdm]


class _Prompt(NamedTuple):
    prompt: str | list[int]
    text: str | None = None  # shown in the outputs of a prompt given as ids
    cache_salt: str | None = None


class LLM:
    """Loads a model once and serves batches of prompts through the paged engine.

    `LLM()` loads the built-in default model; `LLM(model=PATH)` a local HF directory or GGUF file.
    Every other keyword is an EngineConfig field (block_size, kv_cache_memory, dtype, ...).
    """

    def __init__(self, model: str | None = None, **engine_options) -> None:
        known = {f.name for f in fields(EngineConfig)}
        unknown = sorted(set(engine_options) - known)
        if unknown:
            raise InvalidInputError(f"unknown engine option(s) {unknown}; known: {sorted(known)}")
        _show_engine_log()
        self.engine = LLMEngine(EngineConfig(model=model, **engine_options))

    def shutdown(self) -> None:
        """Stop a tensor-parallel engine's workers now (they also stop at exit), so that another may start; a
        one-process engine holds nothing to stop and keeps working."""
        self.engine.shutdown()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def get_tokenizer(self):
        """The model's tokenizer (vLLM's spelling of `tokenizer`)."""
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: Progress = True,
        priority: int | Seq[int] | None = None,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in prompt order, each with its n completions. `priority`: one for every
        prompt or one each, with scheduling_policy="priority" (lower first), as in vLLM."""
        return self._generate(_as_prompt_list(prompts), sampling_params, use_tqdm, priority)

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: Progress = True,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        chat_template: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        priority: int | Seq[int] | None = None,
    ) -> list[RequestOutput]:
        """Apply the model's chat template (or `chat_template`, a Jinja template's text) to each conversation
        (messages as the server takes them: pagedllm.model.chat_template), with `tools` (OpenAI's function tools)
        for templates that take them, then generate. As in vLLM, the tool calls stay in the text: the server's
        tool_choice parses them. `priority` as in generate."""
        for name, value in (("add_generation_prompt", add_generation_prompt),
                            ("continue_final_message", continue_final_message)):
            if not isinstance(value, bool):
                raise InvalidInputError(f"{name} must be True or False, got {value!r}")
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
            raise InvalidInputError(f"chat_template_kwargs must be a dict, got {chat_template_kwargs!r:.80}")
        if chat_template is not None and not isinstance(chat_template, str):
            raise InvalidInputError(f"chat_template must be a template's text, got {chat_template!r:.80}")
        if tools is not None:
            check_tools(tools)
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        options = dict(add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
                       template_kwargs=chat_template_kwargs, chat_template=chat_template, tools=tools)
        rendered = [self.engine.apply_chat_template(c, **options) for c in conversations]
        return self._generate([_Prompt(ids, text) for text, ids in rendered], sampling_params, use_tqdm, priority)

    def beam_search(self, prompts: Prompt | Seq[Prompt], params: BeamSearchParams, use_tqdm: bool = False,
                    concurrency_limit: int | None = None) -> list[BeamSearchOutput]:
        """vLLM's offline beam search call: per prompt its beams, best first, at most concurrency_limit prompts
        searched at once. The same search as generate with SamplingParams(use_beam_search=True), in vLLM's output
        shapes (pagedllm/entrypoints/beam_search.py)."""
        if not isinstance(params, BeamSearchParams):
            raise InvalidInputError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        if concurrency_limit is not None and (not is_int(concurrency_limit) or concurrency_limit < 1):
            raise InvalidInputError(f"concurrency_limit must be a positive integer, got {concurrency_limit!r}")
        sampling, prompt_list = params.sampling_params(), _as_prompt_list(prompts)
        step = concurrency_limit or max(1, len(prompt_list))
        outputs: list[RequestOutput] = []
        for start in range(0, len(prompt_list), step):
            outputs += self._generate(prompt_list[start:start + step], sampling, use_tqdm, None)
        return beam_outputs(outputs, self.engine.tokenizer, params.skip_special_tokens)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block, as vLLM's LLM.reset_prefix_cache() (between benchmark runs, say);
        False, and nothing changed, while a request's blocks are cached (LLMEngine.reset_prefix_cache)."""
        return self.engine.reset_prefix_cache()

    def _generate(self, prompts: list[_Prompt], sampling_params: SamplingParams | Seq[SamplingParams] | None,
                  use_tqdm: Progress, priority: int | Seq[int] | None) -> list[RequestOutput]:
        params = _params_per_prompt(sampling_params, len(prompts), self.engine.default_sampling_params())
        ids = self._add_all(prompts, params, _priorities(priority, len(prompts)))
        return self._run(ids, use_tqdm)

    def _add_all(self, prompts: list[_Prompt], params: list[SamplingParams], priorities: list[int]) -> list[str]:
        ids: list[str] = []
        try:
            for prompt, p, priority in zip(prompts, params, priorities):
                ids.append(self.engine.add_request(None, prompt.prompt, p, cache_salt=prompt.cache_salt,
                                                   prompt_text=prompt.text, priority=priority))
        except Exception:
            for request_id in ids:  # all or nothing: never leave half a batch queued
                self.engine.abort_request(request_id)
            raise
        return ids

    def _run(self, ids: list[str], use_tqdm: Progress) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        bar_type = use_tqdm if callable(use_tqdm) else tqdm
        with bar_type(total=len(ids), desc="generate", unit="req", disable=use_tqdm is False) as bar:
            try:
                while self.engine.has_unfinished_requests():
                    for output in self.engine.step():
                        if output.finished:
                            done[output.request_id] = output
                            bar.update(1)
            except BaseException:  # a failed step (or Ctrl-C): free what this call queued before raising
                for request_id in ids:
                    self.engine.abort_request(request_id)
                raise
        return [done[i] for i in ids]


def _show_engine_log() -> None:
    """The engine's startup lines (device, dtype, KV pool, sampling defaults) on stderr, as vLLM's LLM shows its
    own, unless the program has set up logging itself."""
    logger = logging.getLogger("pagedllm")
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s pagedllm: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False  # logging set up later would print each line again


PROMPT_FORMS = "a string, a list of token ids (ints), a prompt dict (prompt / prompt_token_ids), or a list of those"


def _as_prompt_list(prompts: Prompt | Seq[Prompt]) -> list[_Prompt]:
    if isinstance(prompts, (str, dict)):
        return [_one_prompt(prompts)]
    if not isinstance(prompts, (list, tuple)):
        raise InvalidInputError(f"prompts must be {PROMPT_FORMS}, got {type(prompts).__name__}")
    if prompts and _is_token_ids(prompts):
        return [_Prompt(list(prompts))]  # one prompt given as token ids
    return [_one_prompt(p) for p in prompts]  # none: none to run, as in vLLM


def _one_prompt(prompt: object) -> _Prompt:
    if isinstance(prompt, str):
        return _Prompt(prompt)
    if _is_token_ids(prompt):
        return _Prompt(list(prompt))
    if not isinstance(prompt, dict):
        raise InvalidInputError(f"each prompt must be a string, a list of token ids (ints) or a prompt dict, "
                                f"got {prompt!r:.80}")
    if unknown := sorted(set(prompt) - set(PROMPT_KEYS)):
        raise InvalidInputError(f"prompt dict key(s) {unknown} are not supported; known: {', '.join(PROMPT_KEYS)}")
    text, ids, salt = (prompt.get(key) for key in PROMPT_KEYS)
    if text is not None and not isinstance(text, str) or ids is not None and not _is_token_ids(ids):
        raise InvalidInputError(f"a prompt dict's prompt must be a string and its prompt_token_ids a list of ints, "
                                f"got {prompt!r:.80}")
    if salt is not None and not isinstance(salt, str):
        raise InvalidInputError(f"cache_salt must be a string, got {salt!r:.80}")
    if ids is not None:
        return _Prompt(list(ids), text, salt)
    if text is None:
        raise InvalidInputError("a prompt dict needs prompt or prompt_token_ids")
    return _Prompt(text, None, salt)


def _is_token_ids(value: object) -> bool:
    return isinstance(value, (list, tuple)) and all(map(is_int, value))


def _params_per_prompt(params: SamplingParams | Seq[SamplingParams] | None, count: int,
                       default: SamplingParams) -> list[SamplingParams]:
    if params is None:
        return [default] * count
    if isinstance(params, SamplingParams):
        return [params] * count
    if not isinstance(params, (list, tuple)) or not all(isinstance(p, SamplingParams) for p in params):
        raise InvalidInputError(f"sampling_params must be a SamplingParams or a list of them, got {params!r:.80}")
    if len(params) != count:
        raise InvalidInputError(f"got {len(params)} SamplingParams for {count} prompts")
    return list(params)


def _priorities(priority: int | Seq[int] | None, count: int) -> list[int]:
    """One priority per prompt (the engine checks each value); 0 where none is given."""
    if priority is None or is_int(priority):
        return [priority or 0] * count
    if not isinstance(priority, (list, tuple)) or len(priority) != count:
        raise InvalidInputError(f"priority must be an int or a list of one per prompt ({count}), got {priority!r:.80}")
    return list(priority)
