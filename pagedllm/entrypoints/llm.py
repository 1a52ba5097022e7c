"""The offline API: `LLM().generate(prompts, SamplingParams(...))`."""

from collections.abc import Sequence as Seq
from dataclasses import fields
from typing import Any

from tqdm import tqdm

from pagedllm.checks import is_int
from pagedllm.config import EngineConfig
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.engine.outputs import RequestOutput
from pagedllm.engine.stats import EngineStats
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import SamplingParams

Prompt = str | list[int]


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
        self.engine = LLMEngine(EngineConfig(model=model, **engine_options))

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in prompt order, each with its n completions."""
        prompts = _as_prompt_list(prompts)
        params = _params_per_prompt(sampling_params, len(prompts), self.engine.default_sampling_params())
        ids = self._add_all(prompts, params)
        return self._run(ids, use_tqdm)

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to each conversation (messages as the server takes them:
        pagedllm.model.chat_template), then generate."""
        for name, value in (("add_generation_prompt", add_generation_prompt),
                            ("continue_final_message", continue_final_message)):
            if not isinstance(value, bool):
                raise InvalidInputError(f"{name} must be True or False, got {value!r}")
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
            raise InvalidInputError(f"chat_template_kwargs must be a dict, got {chat_template_kwargs!r:.80}")
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        options = dict(add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
                       template_kwargs=chat_template_kwargs)
        prompts = [self.engine.apply_chat_template(c, **options) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def _add_all(self, prompts: list[Prompt], params: list[SamplingParams]) -> list[str]:
        ids: list[str] = []
        try:
            for prompt, p in zip(prompts, params):
                ids.append(self.engine.add_request(None, prompt, p))
        except Exception:
            for request_id in ids:  # all or nothing: never leave half a batch queued
                self.engine.abort_request(request_id)
            raise
        return ids

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc="generate", unit="req", disable=not use_tqdm) as bar:
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


PROMPT_FORMS = "a string, a list of token ids (ints), or a list of those"


def _as_prompt_list(prompts: Prompt | Seq[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise InvalidInputError(f"prompts must be {PROMPT_FORMS}, got {type(prompts).__name__}")
    if not prompts:
        raise InvalidInputError("no prompts given")
    if _is_token_ids(prompts):
        return [list(prompts)]  # one prompt given as token ids
    for p in prompts:
        if not (isinstance(p, str) or _is_token_ids(p)):
            raise InvalidInputError(f"each prompt must be a string or a list of token ids (ints), got {p!r:.80}")
    return [p if isinstance(p, str) else list(p) for p in prompts]


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
