"""A small stand-in for LLMEngine that follows its contract (used until/besides the real one).

Byte-level "tokenizer" (ids 0..255 are bytes, 256 is EOS); generation cycles through a fixed
sentence; a real little block pool (n completions share the prompt's full blocks, blocks are
taken as tails fill, the newest request is preempted when none is free).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace

from pagedllm.config import EngineConfig
from pagedllm.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprob
from pagedllm.engine.stats import EngineStats
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import SamplingParams

EOS = 256
SENTENCE = "The quick brown fox jumps over the lazy dog. Paris is the capital of France. "
NATURAL_LENGTH = 48  # tokens before EOS when max_tokens allows it


class FakeTokenizer:
    eos_token_id = EOS

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def convert_ids_to_tokens(self, ids: int | list[int]) -> str | list[str]:
        if isinstance(ids, int):
            return chr(ids) if ids < 256 else "<eos>"
        return [self.convert_ids_to_tokens(i) for i in ids]

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, tokenize: bool = True,
                            continue_final_message: bool = False, **template_kwargs) -> list[int] | str:
        """A byte-level template; template kwargs reach it as they reach a real one's (this one reads none)."""
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        text = text.removesuffix("\n") if continue_final_message else text
        text += "<assistant>" if add_generation_prompt else ""
        return self.encode(text) if tokenize else text


@dataclass
class _Seq:
    index: int
    blocks: list[int]
    generated: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    sent_chars: int = 0  # what earlier outputs carried: each output carries only what is new, like the engine's
    sent_tokens: int = 0


@dataclass
class _Req:
    request_id: str
    prompt: str | None
    prompt_ids: list[int]
    params: SamplingParams
    offset: int
    metrics: RequestMetrics
    seqs: list[_Seq] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return bool(self.seqs) and all(s.finish_reason for s in self.seqs)


class _Pool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free: deque[int] = deque(range(num_blocks))
        self.cached: deque[int] = deque()  # free but holding a "prefix"
        self.refs = [0] * num_blocks

    def available(self) -> int:
        return len(self.free) + len(self.cached)

    def take(self) -> int:
        block = self.free.popleft() if self.free else self.cached.popleft()
        self.refs[block] = 1
        return block

    def release(self, block: int, cache: bool) -> None:
        self.refs[block] -= 1
        if self.refs[block] == 0:
            (self.cached if cache else self.free).append(block)


class FakeEngine:
    def __init__(self, config: EngineConfig, step_delay: float = 0.002) -> None:
        self.config = config
        self.tokenizer = FakeTokenizer()
        self.model_config = SimpleNamespace(vocab_size=EOS + 1)
        self.max_model_len = config.max_model_len or 256
        self.model_name = config.served_model_name or "fake-model"
        self.sampling_defaults: dict = {}
        self.step_delay = step_delay
        self.pool = _Pool(config.num_blocks or 64)
        self.requests: dict[str, _Req] = {}
        self.waiting: deque[str] = deque()
        self.running: list[str] = []
        self.counters = {"preemptions": 0, "prompt": 0, "generation": 0, "queries": 0}
        self.step_calls = 0

    # ---- contract ----------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    arrival_time: float | None = None, cache_salt: str | None = None, priority: int = 0) -> None:
        if priority != 0:
            raise InvalidInputError("the fake engine schedules first come, first served")
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._validate(request_id, ids, params)
        offset = 0 if params.temperature == 0 else (params.seed or len(self.requests) * 5)
        self.requests[request_id] = _Req(request_id, prompt if isinstance(prompt, str) else None, ids,
                                         params, offset, RequestMetrics(arrival_time or time.time()))
        self.waiting.append(request_id)

    def compile_constraint(self, params: SamplingParams) -> None:
        """The fake engine ignores structured outputs."""

    def reset_prefix_cache(self) -> bool:
        """As LLMEngine's: refused while requests run; else the cached blocks become plain free ones."""
        if self.running:
            return False
        self.pool.free.extend(self.pool.cached)
        self.pool.cached.clear()
        return True

    def abort_request(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        self._free(req)
        if request_id in self.waiting:
            self.waiting.remove(request_id)
        if request_id in self.running:
            self.running.remove(request_id)

    def step(self) -> list[RequestOutput]:
        self.step_calls += 1
        time.sleep(self.step_delay)
        self._admit()
        now = time.time()
        outputs = []
        for request_id in list(self.running):
            if request_id not in self.running:
                continue  # preempted by an earlier request in this step
            req = self.requests[request_id]
            self._advance(req, now)
            if request_id not in self.running:
                continue
            outputs.append(self._output(req))
            if req.finished:
                self._finish(req, now)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def stats(self) -> EngineStats:
        used = sum(1 for r in self.pool.refs if r > 0)
        stored = sum(self._filled().values())
        total_slots = self.pool.num_blocks * self.config.block_size
        return EngineStats(
            num_blocks=self.pool.num_blocks, block_size=self.config.block_size, blocks_used=used,
            blocks_free=self.pool.available(), blocks_cached_free=len(self.pool.cached),
            tokens_stored=stored, token_occupancy=stored / total_slots,
            block_occupancy=used / self.pool.num_blocks, prefix_queries_tokens=self.counters["queries"],
            prefix_hits_tokens=0, num_preemptions=self.counters["preemptions"],
            num_running=len(self.running), num_waiting=len(self.waiting),
            prompt_tokens_total=self.counters["prompt"], generation_tokens_total=self.counters["generation"])

    def kv_snapshot(self, offset: int = 0, limit: int | None = None) -> dict:
        filled, owners = self._filled(), self._owners()
        cached = set(self.pool.cached)
        blocks = []
        for block in range(self.pool.num_blocks):
            ref = self.pool.refs[block]
            state = "used" if ref > 0 else ("cached" if block in cached else "free")
            blocks.append({"id": block, "state": state, "ref_cnt": ref, "filled": filled.get(block, 0),
                           "owners": sorted(set(owners.get(block, [])))})
        stats = self.stats()
        used_slots = stats.blocks_used * stats.block_size
        waste = {"used_slots": used_slots, "tokens_stored": stats.tokens_stored,
                 "empty_tail_slots": used_slots - stats.tokens_stored,
                 "empty_tail_fraction": (used_slots - stats.tokens_stored) / used_slots if used_slots else 0.0,
                 "token_occupancy": stats.token_occupancy, "block_occupancy": stats.block_occupancy,
                 "slots_reserved": 0}
        counts = {state: sum(b["state"] == state for b in blocks) for state in ("used", "cached", "free")}
        requests: dict[str, int] = {}
        for block in blocks:
            for owner in block["owners"]:
                requests[owner] = requests.get(owner, 0) + 1
        return {"block_size": self.config.block_size, "num_blocks": self.pool.num_blocks, "offset": offset,
                "blocks": blocks[offset: None if limit is None else offset + limit],
                "counts": {**counts, "shared": sum(b["ref_cnt"] > 1 for b in blocks)}, "requests": requests,
                "waste": waste, "running": stats.num_running, "waiting": stats.num_waiting,
                "prefix_cache": {"queries_tokens": stats.prefix_queries_tokens, "hits_tokens": 0}}

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        return self.tokenizer.apply_chat_template(messages)

    # ---- internals ---------------------------------------------------------------------

    def _validate(self, request_id: str, ids: list[int], params: SamplingParams) -> None:
        if request_id in self.requests:
            raise InvalidInputError(f"request id {request_id!r} is already in use")
        if not ids:
            raise InvalidInputError("prompt must not be empty")
        if len(ids) >= self.max_model_len:
            raise InvalidInputError(f"prompt is {len(ids)} tokens, the model's max length is {self.max_model_len}")
        if any(not 0 <= t <= EOS for t in ids):
            raise InvalidInputError("prompt token ids must be in [0, 256]")
        if params.n > self.config.max_n:
            raise InvalidInputError(f"n must be at most {self.config.max_n}, got {params.n}")
        if self._blocks_for(len(ids) + 1) * params.n > self.pool.num_blocks:
            raise InvalidInputError("this request can never fit in the KV pool")

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.config.block_size)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            req = self.requests[self.waiting[0]]
            if self._blocks_needed(req) > self.pool.available():
                return
            self.waiting.popleft()
            self._allocate(req)
            self.running.append(req.request_id)
            req.metrics.first_scheduled_time = req.metrics.first_scheduled_time or time.time()
            self.counters["prompt"] += len(req.prompt_ids)
            self.counters["queries"] += len(req.prompt_ids)

    def _seq_list(self, req: _Req) -> list[_Seq]:
        return req.seqs or [_Seq(i, []) for i in range(req.params.n)]

    def _blocks_needed(self, req: _Req) -> int:
        full = len(req.prompt_ids) // self.config.block_size
        return full + sum(self._blocks_for(len(req.prompt_ids) + len(s.generated)) - full
                          for s in self._seq_list(req))

    def _allocate(self, req: _Req) -> None:
        """Blocks for the prompt (full ones shared by the n sequences) and any tokens kept from before a preemption."""
        req.seqs = self._seq_list(req)
        full = len(req.prompt_ids) // self.config.block_size
        shared = [self.pool.take() for _ in range(full)]
        for block in shared:
            self.pool.refs[block] = len(req.seqs)
        for seq in req.seqs:
            own = self._blocks_for(len(req.prompt_ids) + len(seq.generated)) - full
            seq.blocks = shared + [self.pool.take() for _ in range(own)]

    def _advance(self, req: _Req, now: float) -> None:
        for seq in req.seqs:
            if seq.finish_reason is not None:
                continue
            if not self._ensure_slot(req, seq):
                return  # this request itself was preempted
            self._append(req, seq, now)
        if req.metrics.first_token_time is None:
            req.metrics.first_token_time = now
        req.metrics.token_times.append(now)

    def _ensure_slot(self, req: _Req, seq: _Seq) -> bool:
        tokens = len(req.prompt_ids) + len(seq.generated)
        if tokens < len(seq.blocks) * self.config.block_size:
            return True
        while self.pool.available() == 0:
            victim = self.running[-1]
            self._preempt(self.requests[victim])
            if victim == req.request_id:
                return False
        seq.blocks.append(self.pool.take())
        return True

    def _preempt(self, req: _Req) -> None:
        self._free(req)  # recompute: generated tokens are kept, their KV is not
        self.running.remove(req.request_id)
        self.waiting.appendleft(req.request_id)
        req.metrics.num_preemptions += 1
        self.counters["preemptions"] += 1

    def _append(self, req: _Req, seq: _Seq, now: float) -> None:
        p, k = req.params, len(seq.generated)
        forced = [t for t, bias in (p.logit_bias or {}).items() if bias >= 100]  # what a +100 bias does to a model
        forced += (p.allowed_token_ids or [])[:1]  # and what allowed tokens do: one of them
        token = forced[0] if forced else EOS if k >= NATURAL_LENGTH and not p.ignore_eos else \
            ord(SENTENCE[(req.offset + seq.index * 7 + k) % len(SENTENCE)])
        seq.generated.append(token)
        self.counters["generation"] += 1
        if p.logprobs is not None:
            top = {(token + j) % 256: -0.25 * (j + 1) for j in range(p.logprobs)}
            seq.logprobs.append(TokenLogprob(token, -0.25, top))
        self._update_text(req, seq)

    def _update_text(self, req: _Req, seq: _Seq) -> None:
        p = req.params
        full = self.tokenizer.decode(seq.generated)
        for stop in p.stop:
            at = full.find(stop)
            if at >= 0:
                seq.text = full[:at + (len(stop) if p.include_stop_str_in_output else 0)]
                seq.finish_reason, seq.stop_reason = "stop", stop
                return
        if seq.generated[-1] == EOS:
            seq.finish_reason, seq.text = "stop", full
        elif p.max_tokens is not None and len(seq.generated) >= p.max_tokens or \
                len(req.prompt_ids) + len(seq.generated) >= self.max_model_len:
            seq.finish_reason, seq.text = "length", full
        else:  # hold back what could still become a stop string
            hold = max((len(s) - 1 for s in p.stop), default=0)
            seq.text = full[:len(full) - hold] if hold else full

    def _output(self, req: _Req) -> RequestOutput:
        outs = [self._completion(req, s) for s in req.seqs]
        return RequestOutput(req.request_id, req.prompt, list(req.prompt_ids), outs, req.finished, req.metrics,
                             self._prompt_logprobs(req))

    @staticmethod
    def _prompt_logprobs(req: _Req) -> list[TokenLogprob | None] | None:
        k = req.params.prompt_logprobs
        if k is None:
            return None
        return [None] + [TokenLogprob(t, -0.5, {(t + j) % 256: -0.25 * (j + 1) for j in range(k)})
                         for t in req.prompt_ids[1:]]  # fmt: skip

    def _completion(self, req: _Req, s: _Seq) -> CompletionOutput:
        logprobs = list(s.logprobs) if req.params.logprobs is not None else None
        out = CompletionOutput(s.index, s.text, list(s.generated), logprobs, s.finish_reason, -0.25 * len(s.generated),
                               s.stop_reason, new_text=s.text[s.sent_chars:], new_token_ids=s.generated[s.sent_tokens:],
                               new_logprobs=None if logprobs is None else logprobs[s.sent_tokens:])
        s.sent_chars, s.sent_tokens = len(s.text), len(s.generated)
        return out

    def _finish(self, req: _Req, now: float) -> None:
        req.metrics.finished_time = now
        self._free(req)
        self.running.remove(req.request_id)
        del self.requests[req.request_id]

    def _free(self, req: _Req) -> None:
        full = len(req.prompt_ids) // self.config.block_size
        for seq in req.seqs:
            for position, block in enumerate(seq.blocks):
                self.pool.release(block, cache=self.config.enable_prefix_caching and position < full)
            seq.blocks = []

    def _seq_tokens(self) -> list[tuple[str, list[int], int]]:
        return [(r.request_id, s.blocks, len(r.prompt_ids) + len(s.generated))
                for r in self.requests.values() for s in r.seqs]

    def _filled(self) -> dict[int, int]:
        filled: dict[int, int] = {}
        size = self.config.block_size
        for _, blocks, tokens in self._seq_tokens():
            for i, block in enumerate(blocks):
                filled[block] = max(filled.get(block, 0), min(size, max(0, tokens - i * size)))
        return filled

    def _owners(self) -> dict[int, list[str]]:
        owners: dict[int, list[str]] = {}
        for request_id, blocks, _ in self._seq_tokens():
            for block in blocks:
                owners.setdefault(block, []).append(request_id)
        return owners
