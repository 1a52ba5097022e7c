"""LLMEngine: one step = schedule -> run the model -> sample -> detokenize -> update.

The scheduler owns every sequence's life; the runner and the output stages read the step and return
results, holding no pointer back to the engine.
"""

import gc
import itertools
import logging
import weakref
from pathlib import Path
from typing import Any

from pagedllm.checks import is_int
from pagedllm.config import EngineConfig
from pagedllm.engine.bad_words import bad_word_spellings
from pagedllm.engine.device import resolve_device
from pagedllm.engine.kv_snapshot import kv_snapshot
from pagedllm.engine.executor import Executor, LocalExecutor
from pagedllm.engine.grammar import GrammarCompiler
from pagedllm.engine.model_runner import ModelRunner, SeqInput
from pagedllm.engine.pool_memory import block_bytes, num_blocks_for_memory
from pagedllm.engine.prompt_logprobs import prompt_rows, record_prompt_logprobs
from pagedllm.engine.output_stage import OutputStage
from pagedllm.engine.thinking_budget import THINKING_NEEDS_TAGS, think_tags
from pagedllm.engine.outputs import RequestOutput
from pagedllm.engine.request import Request
from pagedllm.engine.scheduler import Scheduler
from pagedllm.engine.stats import EngineStats
from pagedllm.engine.step import SchedulerOutput
from pagedllm.engine.step_logits import StepLogits
from pagedllm.engine.text_stage import detokenize
from pagedllm.engine.token_text import TokenText
from pagedllm.errors import InvalidInputError, ModelLoadError
from pagedllm.kv.block_table import blocks_needed
from pagedllm.kv.manager import KVCacheManager
from pagedllm.model.chat_template import render_chat
from pagedllm.model.config import ModelConfig
from pagedllm.model.dtype import describe_dtype, resolve_dtype
from pagedllm.model.projection import describe_matmul
from pagedllm.sampling_params import SamplingParams

logger = logging.getLogger("pagedllm")

_MAX_DEFAULT_LEN = 8192


def _max_model_len(wanted: int | None, model: ModelConfig) -> int:
    """The configured length, or the model's own (at most _MAX_DEFAULT_LEN); never past the model's."""
    model_len = model.context_limit
    if wanted is not None and wanted > model_len:
        what = "maximum context length" if model_len == model.max_position_embeddings else (
            "sliding attention window (pagedllm attends to the whole context, the same only within the window)")
        raise InvalidInputError(f"max_model_len {wanted} exceeds the model's {what} {model_len}")
    return wanted or min(model_len, _MAX_DEFAULT_LEN)


class LLMEngine:
    executor: Executor  # the runner itself, or rank 0's side of tensor parallelism

    def __init__(self, config: EngineConfig | None = None) -> None:
        from pagedllm.model.loader import load_model

        self.config = config = config or EngineConfig()
        parallel = config.tensor_parallel_size > 1
        if parallel:
            _serve_if_torchrun_worker()
        path = config.model or str(_default_model())
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, device=self.device)
        if parallel:
            self.executor, self.model_config = self._start_tensor_parallel(path)
        else:
            self.model, self.model_config = load_model(path, self.dtype, self.device)
        try:
            self._build_around_the_model(path)
        except BaseException:
            if parallel:
                self.executor.shutdown()  # the workers started with the model
            raise
        # Everything built so far (weights, tokenizer, the pool's bookkeeping) lives as long as the engine:
        # keep it out of the garbage collector's scans, which otherwise took ~3% of a run's CPU time.
        # Unfrozen when the engine goes (and at exit, so that extension modules see their objects released):
        # frozen objects are never collected, and the pool's free queue links its blocks in cycles.
        gc.freeze()
        weakref.finalize(self, gc.unfreeze)

    def _build_around_the_model(self, path: str) -> None:
        """The tokenizer, the length, the runner (one process) and the pool's bookkeeping, the scheduler and the
        output stage."""
        from pagedllm.model.tokenizer import load_tokenizer

        config = self.config
        self.tokenizer = load_tokenizer(path)
        self.token_text = TokenText(self.tokenizer)  # each logprobs entry's decoded_token
        self.model_name = config.served_model_name or _model_name(path)
        self.max_model_len = _max_model_len(config.max_model_len, self.model_config)
        if config.tensor_parallel_size == 1:
            self.executor = LocalExecutor(self._build_runner())
        self.runner, self.model = self.executor.runner, self.executor.runner.model
        sharing = config.enable_prefix_caching and config.allocator == "paged"  # contiguous runs share nothing
        self.kv = KVCacheManager(self.runner.num_blocks, config.block_size, sharing)
        self.swap_space = self.executor.swap_space
        token_bytes = block_bytes(self.runner.config, config.block_size, self.dtype) // config.block_size
        swap_tokens = config.swap_space_bytes // token_bytes
        self.scheduler = Scheduler(config, self.kv, self.max_model_len, self.swap_space, swap_tokens)
        self.eos_token_ids = _eos_ids(self.model_config, self.tokenizer)
        self.sampling_defaults = _sampling_defaults(self.model_config.sampling_defaults, path)
        vocab = self.model_config.vocab_size
        tags = think_tags(config.reasoning_parser, config.reasoning_config, self.tokenizer, vocab)
        self.output_stage = OutputStage(self.tokenizer, self.eos_token_ids, config.seed, self.device, tags)
        self.grammars = GrammarCompiler(self.tokenizer, vocab, self.eos_token_ids)
        self.requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self._log_capacity()

    # -- requests ------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str | None,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
        prompt_text: str | None = None,
        priority: int = 0,
    ) -> str:
        """Queue a request; raises InvalidInputError at once if it can never be served. `prompt_text`: the text
        of a prompt given as token ids, for its outputs to show (a rendered chat template). `priority`: with
        scheduling_policy="priority", lower is scheduled first (any integer; 0 by default); under "fcfs" only 0."""
        params = params or self.default_sampling_params()
        request_id = str(next(self._ids)) if request_id is None else request_id
        if request_id in self.requests:
            raise InvalidInputError(f"request id {request_id!r} is already in use")
        self._check_priority(priority)
        text, token_ids = self._tokenize(prompt)
        kept = params.truncated_prompt(token_ids, self.max_model_len)
        text = (text or prompt_text) if len(kept) == len(token_ids) else None  # a cut prompt's text is not its ids'
        request = self._new_request(request_id, text, kept, params, cache_salt)
        request.priority = priority
        if arrival_time is not None:
            request.metrics.arrival_time = arrival_time
        self.scheduler.add(request, self.output_stage.start(request))
        self.requests[request_id] = request
        return request_id

    def _check_priority(self, priority: int) -> None:
        if not is_int(priority):
            raise InvalidInputError(f"priority must be an integer, got {priority!r:.80}")
        if priority != 0 and self.config.scheduling_policy != "priority":
            raise InvalidInputError(f"priority {priority} needs scheduling_policy 'priority' (--scheduling-policy "
                                    "priority); this engine schedules first come, first served")

    def compile_constraint(self, params: SamplingParams) -> object | None:
        """params.structured_outputs compiled (None without one), from any thread: xgrammar keeps what it compiled,
        so the server compiles first in a worker thread and add_request's compile finds it (InvalidInputError for
        one that does not compile)."""
        return None if params.structured_outputs is None else self.grammars.compile(params.structured_outputs)

    def abort_request(self, request_id: str) -> None:
        """Stop a request now and free its blocks; unknown or finished ids are ignored."""
        request = self.requests.pop(request_id, None)
        if request is not None:
            self.scheduler.abort(request)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block hash, so that later prompts find no prefix. Refused (False, nothing changed)
        while a running request holds a hashed block: it would stay findable."""
        return self.kv.reset_prefix_cache()

    # -- the step ------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One iteration; per request that progressed, its output so far and what this step added."""
        if self.failure is not None:
            raise self.failure
        try:
            step = self.scheduler.schedule()
            if not step.scheduled:
                return []
            prompt_logits = [prompt_rows(s) for s in step.scheduled]
            logits = self._execute(step, prompt_logits)
        except BaseException:
            self.kv.step_failed()  # what the pass hashed for the step was never written
            raise
        self.kv.step_ran()
        record_prompt_logprobs(step.scheduled, prompt_logits, logits, len(step.logits_seqs()), self.token_text)
        outcome = self.output_stage.process(step, logits)
        detokenize(outcome, self.tokenizer, self.token_text)
        self.prompt_tokens_total += sum(s.num_prompt_tokens for s in step.scheduled)
        self.generation_tokens_total += outcome.num_generated
        touched = self.scheduler.update(step, outcome)
        for request in touched:
            if request.finished:
                self.requests.pop(request.request_id, None)
        return [r.output() for r in touched]

    def _execute(self, step: SchedulerOutput, prompt_logits: list[range]) -> StepLogits:
        """Copy-on-write copies first, then the model over the step's tokens: logits of the sampled positions,
        then of the prompt positions whose logprobs were asked for."""
        inputs = [SeqInput(s.new_token_ids, s.num_cached, s.block_table, s.needs_logits, rows)
                  for s, rows in zip(step.scheduled, prompt_logits)]  # fmt: skip
        greedy_rows = self.output_stage.greedy_rows(step) + [False] * sum(map(len, prompt_logits))
        return self.executor.execute(step.copies, inputs, greedy_rows)

    @property
    def failure(self) -> BaseException | None:
        """Why the engine can never step again (a tensor-parallel rank died or hung), else None."""
        return self.executor.failure

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers, if any (also done at exit); the engine cannot step afterwards."""
        self.executor.shutdown()

    # -- building requests ---------------------------------------------------------------

    def _tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidInputError("prompt is empty")
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate (as a command line's undecodable bytes become)
                raise InvalidInputError("prompt holds characters that are not valid Unicode") from None
            return prompt, list(self.tokenizer(prompt).input_ids)
        token_ids = list(prompt)
        vocab = self.model_config.vocab_size
        if not token_ids:
            raise InvalidInputError("prompt is empty")
        bad = [t for t in token_ids if not is_int(t) or not 0 <= t < vocab]
        if bad:
            raise InvalidInputError(f"prompt token ids must be integers in [0, {vocab}); got {bad[:3]}")
        return None, token_ids

    def _new_request(
        self, request_id: str, prompt: str | None, token_ids: list[int], params: SamplingParams, cache_salt: str | None
    ) -> Request:
        width = params.beam_width if params.use_beam_search else params.n
        vocab = self.model_config.vocab_size
        banned = params.min_tokens_banned(self.eos_token_ids)
        if params.restricts_tokens and params.min_tokens and set(params.allowed_token_ids) <= banned:
            raise InvalidInputError("allowed_token_ids are all stop tokens, which min_tokens forbids at first: no "
                                    "token could be sampled")
        for name, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", params.logit_bias or {}),
                          ("allowed_token_ids", params.allowed_token_ids or []),
                          ("logprob_token_ids", params.logprob_token_ids or [])):
            if outside := [t for t in ids if t >= vocab]:
                raise InvalidInputError(f"{name} must name tokens below the vocabulary size {vocab}; got {outside[:3]}")
        if params.thinking_token_budget is not None and self.output_stage.think_tags is None:
            raise InvalidInputError(THINKING_NEEDS_TAGS)
        bad_words = bad_word_spellings(self.tokenizer, params.bad_words, vocab) if params.bad_words else []
        if params.restricts_tokens and set(params.allowed_token_ids) <= {s[0] for s in bad_words if len(s) == 1}:
            raise InvalidInputError("allowed_token_ids are all bad_words: no token could be sampled")
        return Request(
            request_id=request_id,
            prompt=prompt,
            prompt_token_ids=token_ids,
            params=params,
            max_total_len=self.scheduler.check_request(len(token_ids), width, params.max_tokens),
            extra_keys=(self.model_name,) + (() if cache_salt is None else ("salt", cache_salt)),
            bad_word_spellings=bad_words,
            grammar=self.compile_constraint(params),
        )

    def warm_up(self, num_tokens: int = 32) -> None:
        """Run the model on a dummy prompt, then one decode step of it, so one-time costs (kernel setup and
        compiles, first page faults) are paid before the first real request. Touches only the pool's first
        blocks, which are free at start."""
        if self.kv.num_used_blocks or self.has_unfinished_requests():
            raise RuntimeError("warm_up() is for a fresh engine")
        total = min(num_tokens, self.kv.num_blocks * self.kv.block_size, self.max_model_len)
        token_ids = [i % self.model_config.vocab_size for i in range(total)]
        prompt_len = max(1, total - 1)  # the last token, if there is room for one, is the decode step's
        for start, end in ((0, prompt_len), (prompt_len, total)):
            if end > start:
                blocks = list(range(blocks_needed(end, self.kv.block_size)))
                self.executor.execute([], [SeqInput(token_ids[start:end], start, blocks, True)], [False])

    # -- stats -----------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        kv = self.kv.stats()
        slots = kv.num_blocks * kv.block_size
        return EngineStats(
            num_blocks=kv.num_blocks,
            block_size=kv.block_size,
            blocks_used=kv.used,
            blocks_free=kv.free,
            blocks_cached_free=kv.cached_free,
            tokens_stored=kv.tokens_stored,
            token_occupancy=kv.tokens_stored / slots,
            block_occupancy=kv.used / kv.num_blocks,
            prefix_queries_tokens=kv.prefix_queries_tokens,
            prefix_hits_tokens=kv.prefix_hits_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            num_running=len(self.scheduler.running),
            running_seqs_peak=self.scheduler.concurrency.peak,
            running_seqs_mean=self.scheduler.concurrency.mean,
            running_seqs_last=self.scheduler.concurrency.last,
            num_waiting=len(self.scheduler.waiting),
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            slots_reserved=self.scheduler.num_reserved_slots,
        )

    def default_sampling_params(self) -> SamplingParams:
        """What a request without its own sampling parameters gets: the model's generation_config.json settings
        over SamplingParams' defaults."""
        return SamplingParams(**self.sampling_defaults)

    def kv_snapshot(self, offset: int = 0, limit: int | None = None) -> dict:
        """Blocks [offset, offset + limit) with the ids of the requests that hold them; the pool's counts and
        waste (pagedllm.engine.kv_snapshot)."""
        request_id_of = lambda seq_id: self.scheduler.request_of(seq_id).request_id  # noqa: E731
        return kv_snapshot(self.kv, self.stats(), request_id_of, offset, limit)

    def apply_chat_template(self, messages: list[dict], **options: Any) -> tuple[str, list[int]]:
        """The conversation's prompt text and ids (pagedllm.model.chat_template.render_chat: as the server makes
        them)."""
        text = render_chat(self.tokenizer, messages, **options)
        return text, list(self.tokenizer.encode(text, add_special_tokens=False))  # the template wrote them

    def _build_runner(self) -> ModelRunner:
        config = self.config
        num_blocks = config.num_blocks or self._blocks_for_budget()
        runner = ModelRunner(
            self.model, self.model_config, num_blocks, config.block_size, self.dtype, config.attention_impl, self.device
        )
        if self.device.type == "cuda" and not config.enforce_eager:
            runner.capture_graphs(config.max_num_seqs, self.max_model_len)
        return runner

    def _blocks_for_budget(self) -> int:
        """On CUDA from gpu_memory_utilization (a profiled step), else from kv_cache_memory."""
        if self.device.type == "cuda":
            from pagedllm.engine.pool_sizing import gpu_pool_blocks

            return gpu_pool_blocks(
                self.model, self.model_config, self.config, self.dtype, self.device, self.max_model_len
            )
        return num_blocks_for_memory(self.model_config, self.config.block_size, self.dtype, self.config.kv_cache_memory)

    def _start_tensor_parallel(self, path: str) -> tuple[Executor, ModelConfig]:
        """Rank 0 of a tensor-parallel engine: the other ranks started (or joined, under torchrun) and every
        rank's shard loaded. Each rank's pool gets kv_cache_memory for its own KV heads."""
        from pagedllm.distributed.startup import start_rank0
        config = self.config
        if self.device.type == "cuda" and self.device.index not in (None, 0):
            raise InvalidInputError("with tensor_parallel_size > 1 each rank uses the GPU of its local rank; "
                                    "choose GPUs with CUDA_VISIBLE_DEVICES and pass device='cuda'")

        def blocks_per_rank(local_config: ModelConfig) -> int:
            budget = config.kv_cache_memory
            return config.num_blocks or num_blocks_for_memory(local_config, config.block_size, self.dtype, budget)

        executor, model_config = start_rank0(
            path, self.dtype, self.device.type, config.tensor_parallel_size, config.block_size,
            config.attention_impl, blocks_per_rank,
        )
        self.device = executor.runner.device  # rank 0's GPU is its local rank's
        return executor, model_config

    def _log_capacity(self) -> None:
        dtype = describe_dtype(self.config.dtype, self.dtype, self.device)
        streamed, packed = self.model.count_streamed_blocks()
        blocks = f" (small batches stream the GGUF's blocks of {streamed} of {packed} weights)"
        logger.info("device %s; dtype %s; matmul %s%s; attention %s", self.device, dtype,
                    describe_matmul(self.dtype, self.device), blocks if streamed else "", self.runner.attention_impl)
        mc, kv = self.runner.config, self.kv  # a tensor-parallel rank's own KV heads
        per_block = block_bytes(mc, kv.block_size, self.dtype)
        logger.info(
            "KV pool: %d blocks x %d tokens = %d tokens (%.0f MiB %s); %d requests of the max length %d fit at once",
            kv.num_blocks,
            kv.block_size,
            kv.num_blocks * kv.block_size,
            kv.num_blocks * per_block / 2**20,
            str(self.dtype).removeprefix("torch."),
            kv.num_blocks // blocks_needed(self.max_model_len, kv.block_size),
            self.max_model_len,
        )


def _serve_if_torchrun_worker() -> None:
    """Under torchrun every rank runs the same command: ranks > 0 serve rank 0's steps, then exit here."""
    from pagedllm.distributed.startup import is_torchrun_worker, run_torchrun_worker

    if is_torchrun_worker():
        raise SystemExit(run_torchrun_worker())


def _default_model() -> Path:
    from pagedllm.model.default_model import require_default_model

    return require_default_model()


def _model_name(path: str) -> str:
    from pathlib import Path

    from pagedllm.model.default_model import DEFAULT_MODEL_NAME, default_model_path

    if Path(path) == default_model_path():
        return DEFAULT_MODEL_NAME
    return Path(path).stem if Path(path).is_file() else Path(path).name


def _sampling_defaults(defaults: dict[str, Any], path: str) -> dict[str, Any]:
    """The model's sampling defaults, checked as SamplingParams checks a request's, and said at start."""
    try:
        SamplingParams(**defaults)
    except InvalidInputError as exc:
        raise ModelLoadError(f"{path}: generation_config.json's sampling settings: {exc}") from None
    if defaults:
        settings = ", ".join(f"{name}={value}" for name, value in defaults.items())
        logger.info("sampling defaults from the model's generation_config.json: %s (a request's own values win)",
                    settings)
    return defaults


def _eos_ids(model_config: ModelConfig, tokenizer: Any) -> set[int]:
    """Every id that ends generation: the model's end tokens (Llama 3 has several) and the tokenizer's; one the
    model cannot produce (outside its vocabulary) is left out, as masking it for min_tokens would fail."""
    ids = set(model_config.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    if outside := {i for i in ids if not 0 <= i < model_config.vocab_size}:
        logger.warning("end-of-sequence ids %s are outside the vocabulary of %d; ignored", sorted(outside),
                       model_config.vocab_size)
    return ids - outside
