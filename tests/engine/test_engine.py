"""The engine end to end on a tiny random model: batching, preemption, prefix caching, sharing, aborts."""

import random

import pytest
import torch

from pagedllm.config import EngineConfig
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import SamplingParams

GREEDY = dict(temperature=0.0, ignore_eos=True)


def make_engine(model_dir, **overrides) -> LLMEngine:
    options = dict(model=str(model_dir), num_blocks=256, block_size=4, max_num_batched_tokens=64,
                   dtype="float32")  # transformers is the float32 oracle
    options.update(overrides)
    return LLMEngine(EngineConfig(**options))


def run_all(engine: LLMEngine, prompts, params, check_every_step: bool = False) -> list:
    """Add every prompt, step to the end (checking the pool's invariants); outputs in prompt order."""
    params = params if isinstance(params, list) else [params] * len(prompts)
    ids = [engine.add_request(None, p, sp) for p, sp in zip(prompts, params)]
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        if check_every_step:
            engine.kv.check_invariants()
    engine.kv.check_invariants()
    assert engine.kv.num_used_blocks == 0, "blocks leaked after every request ended"
    return [done[i] for i in ids]


def random_prompts(count: int, seed: int = 0, low: int = 3, high: int = 60) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 384) for _ in range(rng.randint(low, high))] for _ in range(count)]


def tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def hf_model(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


def hf_greedy(hf_model, prompt: list[int], max_new: int) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]), max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False,
            eos_token_id=None, pad_token_id=0,
        )
    return out[0, len(prompt):].tolist()


def test_batched_greedy_equals_alone_and_transformers(tiny_llama_dir, hf_model):
    prompts = random_prompts(32, seed=1)
    lengths = [8 + (i * 7) % 25 for i in range(32)]
    params = [SamplingParams(max_tokens=n, **GREEDY) for n in lengths]
    engine = make_engine(tiny_llama_dir)
    batched = tokens(run_all(engine, prompts, params))
    for i in (0, 5, 17, 31):
        alone = tokens(run_all(make_engine(tiny_llama_dir), [prompts[i]], params[i]))[0]
        assert batched[i] == alone
    for i in range(32):
        assert batched[i] == hf_greedy(hf_model, prompts[i], lengths[i]), f"request {i} differs from transformers"


@pytest.mark.parametrize("mode,swap_space", [("recompute", "4GiB"), ("swap", 4), ("swap", "4KiB"), ("swap", 0)])
def test_preemption_keeps_greedy_tokens_and_frees_everything(tiny_llama_dir, mode, swap_space, monkeypatch):
    """A swap space too small for a victim (4 KiB: a few tokens of this model; 0) recomputes it instead."""
    prompts = random_prompts(12, seed=2, low=10, high=40)
    params = SamplingParams(max_tokens=30, **GREEDY)
    reference = tokens(run_all(make_engine(tiny_llama_dir), prompts, params))
    small = make_engine(tiny_llama_dir, num_blocks=40, preemption_mode=mode, swap_space=swap_space)
    most_held, save = [0], small.swap_space.save
    def recording_save(*args):
        save(*args)
        most_held[0] = max(most_held[0], small.swap_space.tokens_held)
    monkeypatch.setattr(small.swap_space, "save", recording_save)
    squeezed = tokens(run_all(small, prompts, params))
    assert most_held[0] <= small.scheduler.swap_tokens
    if swap_space != "4KiB":
        assert (most_held[0] > 0) == (mode == "swap" and swap_space == 4)  # 4: GiB, as vLLM counts it
    assert small.stats().num_preemptions > 0, "the pool was meant to be too small for all requests at once"
    assert squeezed == reference
    assert small.stats().num_running == 0 and small.stats().num_waiting == 0
    assert len(small.swap_space) == 0


def test_beams_are_swapped_out_together_or_recomputed_together(tiny_llama_dir):
    """A swap space with room for some beams of a request but not all: one choice for the request (a swapped
    beam came back a step after its recomputed sibling, and the search step lacked its logits)."""
    rng = random.Random(2)
    prompts = [[rng.randrange(3, 384) for _ in range(rng.randint(10, 40))] for _ in range(8)]
    params = SamplingParams(max_tokens=20, use_beam_search=True, n=2, temperature=0, ignore_eos=True)
    runs = {}
    for swap_space in ("4GiB", "20KiB"):
        engine = make_engine(tiny_llama_dir, num_blocks=60, preemption_mode="swap", swap_space=swap_space)
        runs[swap_space] = [[c.token_ids for c in o.outputs] for o in run_all(engine, prompts, params)]
        assert engine.stats().num_preemptions > 0 and len(engine.swap_space) == 0
    assert runs["20KiB"] == runs["4GiB"]


@pytest.mark.parametrize("num_blocks", [60, 90])
def test_swapped_requests_come_back_with_room_to_go_on(tiny_llama_dir, num_blocks):
    """Restored into the last free blocks, a swapped request was the first victim of the next block a running one
    needed: swapped out and in every other step without computing a token (18 and 8 preemptions here, where
    recompute needs 4 and 2)."""
    prompts = [random_prompts(1, seed=s, low=n, high=n)[0] for s, n in ((1, 100), (2, 80), (3, 120), (4, 60))]
    params = SamplingParams(max_tokens=40, **GREEDY)
    runs = {}
    for mode in ("recompute", "swap"):
        engine = make_engine(tiny_llama_dir, num_blocks=num_blocks, preemption_mode=mode)
        runs[mode] = (tokens(run_all(engine, prompts, params)), engine.stats().num_preemptions)
    assert runs["swap"][0] == runs["recompute"][0]
    assert 0 < runs["swap"][1] <= runs["recompute"][1] + 1


def test_prefix_caching_computes_only_unshared_tokens(tiny_llama_dir):
    shared = random_prompts(1, seed=3, low=64, high=64)[0]
    suffixes = random_prompts(6, seed=4, low=5, high=9)
    prompts = [shared + s for s in suffixes]
    params = SamplingParams(max_tokens=6, **GREEDY)
    cached = make_engine(tiny_llama_dir, max_num_batched_tokens=512)
    first = tokens(run_all(cached, prompts[:1], params))
    before = cached.stats().prompt_tokens_total
    rest = run_all(cached, prompts[1:], params)
    computed = cached.stats().prompt_tokens_total - before
    assert computed == sum(len(s) for s in suffixes[1:]), "only the unshared suffixes should be prefilled"
    assert all(o.metrics.num_cached_prompt_tokens == 64 for o in rest)
    uncached = make_engine(tiny_llama_dir, enable_prefix_caching=False)
    assert first + tokens(rest) == tokens(run_all(uncached, prompts, params))


def test_a_readmitted_prompt_does_not_count_its_own_earlier_blocks_as_cached(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, num_blocks=12, max_num_batched_tokens=9)
    short, long = random_prompts(2, seed=0, low=4, high=4)[0], random_prompts(1, seed=1, low=40, high=40)[0]
    engine.add_request("a", short, SamplingParams(max_tokens=30, **GREEDY))
    engine.add_request("v", long, SamplingParams(max_tokens=2, **GREEDY))
    outputs = {}
    while engine.has_unfinished_requests():
        outputs.update((o.request_id, o) for o in engine.step() if o.finished)
    # v is preempted mid-prompt; readmitted, it finds the chunks it computed before in the prefix cache
    assert outputs["v"].metrics.num_preemptions == 1
    assert outputs["v"].metrics.num_cached_prompt_tokens == 0  # what the cache held when it first came in


@pytest.mark.parametrize("mode,caching", [("recompute", True), ("swap", True), ("recompute", False)])
def test_prefix_counters_count_each_prompt_once_through_preemptions(tiny_llama_dir, mode, caching):
    shared = random_prompts(1, seed=21, low=16, high=16)[0]
    prompts = [shared + p for p in random_prompts(6, seed=22, low=5, high=30)]
    engine = make_engine(tiny_llama_dir, num_blocks=24, preemption_mode=mode, enable_prefix_caching=caching)
    outputs = run_all(engine, prompts, SamplingParams(max_tokens=20, **GREEDY))
    stats = engine.stats()
    assert stats.num_preemptions > 0, "the pool was meant to preempt"
    queried = sum(map(len, prompts)) if caching else 0  # swap-ins and readmissions look nothing up anew
    assert (stats.prefix_queries_tokens, stats.prefix_hits_tokens) == (
        queried, sum(o.metrics.num_cached_prompt_tokens for o in outputs))


def test_cache_salt_keeps_tenants_apart(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    prompt = random_prompts(1, seed=5, low=40, high=40)[0]
    params = SamplingParams(max_tokens=2, **GREEDY)
    engine.add_request("a", prompt, params, cache_salt="tenant-a")
    while engine.has_unfinished_requests():
        engine.step()
    engine.add_request("b", prompt, params, cache_salt="tenant-b")
    engine.step()
    assert engine.requests["b"].metrics.num_cached_prompt_tokens == 0
    engine.abort_request("b")


def test_parallel_sampling_stores_prompt_once(tiny_llama_dir):
    prompt = random_prompts(1, seed=6, low=40, high=40)[0]
    engine = make_engine(tiny_llama_dir, enable_prefix_caching=False)
    engine.add_request("n4", prompt, SamplingParams(n=4, max_tokens=3, temperature=1.0, seed=7, ignore_eos=True))
    engine.step()  # prefill: one sequence
    engine.step()  # first decode: four sequences sharing the prompt's blocks
    shared_used = engine.kv.num_used_blocks
    prompt_blocks = len(prompt) // 4  # 40 tokens = 10 full blocks, shared by all four
    assert shared_used == prompt_blocks + 4 * 1  # each child owns only its own tail block
    independent = 4 * (-(-(len(prompt) + 1) // 4))
    assert shared_used < independent
    engine.abort_request("n4")
    assert engine.kv.num_used_blocks == 0


def test_seeded_sampling_same_alone_and_in_a_full_batch(tiny_llama_dir):
    prompt = random_prompts(1, seed=9)[0]
    seeded = SamplingParams(max_tokens=20, temperature=0.9, top_p=0.9, seed=1234, ignore_eos=True)
    alone = tokens(run_all(make_engine(tiny_llama_dir), [prompt], seeded))[0]
    others = random_prompts(15, seed=10)
    noise = SamplingParams(max_tokens=25, temperature=1.0, ignore_eos=True)
    batch = run_all(make_engine(tiny_llama_dir), others[:7] + [prompt] + others[7:], [noise] * 7 + [seeded] + [noise] * 8)
    assert batch[7].outputs[0].token_ids == alone


def test_abort_mid_generation_frees_blocks(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    for i, p in enumerate(random_prompts(4, seed=12)):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=50, **GREEDY))
    for _ in range(5):
        engine.step()
    assert engine.kv.num_used_blocks > 0
    for i in range(4):
        engine.abort_request(f"r{i}")
    engine.kv.check_invariants()
    assert engine.kv.num_used_blocks == 0 and not engine.has_unfinished_requests()


def test_requests_that_can_never_fit_are_rejected_at_once(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, num_blocks=8, max_model_len=128)
    with pytest.raises(InvalidInputError, match="maximum context length"):
        engine.add_request(None, list(range(5, 200)), SamplingParams(max_tokens=4))
    with pytest.raises(InvalidInputError, match="KV blocks"):
        engine.add_request(None, list(range(5, 30)), SamplingParams(max_tokens=60))
    with pytest.raises(InvalidInputError, match="empty"):
        engine.add_request(None, [], SamplingParams())
    (out,) = run_all(engine, [list(range(5, 15))], SamplingParams(max_tokens=5, **GREEDY))
    assert len(out.outputs[0].token_ids) == 5


def test_chunked_prefill_shares_steps_with_decodes(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, max_num_batched_tokens=16)
    engine.add_request("short", random_prompts(1, seed=13, low=5, high=5)[0], SamplingParams(max_tokens=40, **GREEDY))
    engine.step()
    engine.add_request("long", random_prompts(1, seed=14, low=100, high=100)[0], SamplingParams(max_tokens=2, **GREEDY))
    out = engine.scheduler.schedule()
    by_id = {s.request.request_id: s.num_new_tokens for s in out.scheduled}
    assert by_id == {"short": 1, "long": 15}


def test_a_beam_search_prompt_is_chunked_within_the_step_budget(tiny_llama_dir):
    """Its one prompt sequence chunks like any other (only live beams move together): it waited behind an older
    request for a step to itself, then ran the rest of its prompt in one step past the budget."""
    engine = make_engine(tiny_llama_dir, max_num_batched_tokens=8)
    steps: list[dict[str, int]] = []
    schedule = engine.scheduler.schedule

    def recorded():
        out = schedule()
        steps.append({s.request.request_id: s.num_new_tokens for s in out.scheduled})
        return out

    engine.scheduler.schedule = recorded
    beam = SamplingParams(n=2, use_beam_search=True, beam_width=2, temperature=0.0, max_tokens=3)
    prompt = random_prompts(1, seed=16, low=60, high=60)[0]
    engine.add_request("older", random_prompts(1, seed=15, low=5, high=5)[0], SamplingParams(max_tokens=30, **GREEDY))
    engine.step()
    engine.add_request("beam", prompt, beam)
    outputs = {}
    while engine.has_unfinished_requests():
        outputs |= {o.request_id: o for o in engine.step() if o.finished}
    assert max(sum(step.values()) for step in steps) <= 8
    assert [step.get("beam") for step in steps[1:10]] == [7] * 8 + [4]  # 60 = 8 x 7 + 4, beside the older decode
    alone = run_all(make_engine(tiny_llama_dir), [prompt], beam)[0]
    assert [c.token_ids for c in outputs["beam"].outputs] == [c.token_ids for c in alone.outputs]


def hf_beam(hf_model, prompt: list[int], width: int, max_new: int, length_penalty: float, early_stopping) -> list[list[int]]:
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]), num_beams=width, num_return_sequences=width, max_new_tokens=max_new,
            do_sample=False, length_penalty=length_penalty, early_stopping=early_stopping,
            eos_token_id=2, pad_token_id=0,
        )
    rows = [r[len(prompt):].tolist() for r in out]
    return [r[: r.index(2) + 1] if 2 in r else r for r in rows]  # drop padding after EOS


@pytest.mark.parametrize("width,length_penalty,early_stopping", [(2, 1.0, False), (4, 0.5, True), (3, 2.0, "never")])
def test_beam_search_equals_transformers(tiny_llama_dir, hf_model, width, length_penalty, early_stopping):
    prompts = random_prompts(3, seed=20 + width)
    params = SamplingParams(
        n=width, use_beam_search=True, beam_width=width, temperature=0.0, max_tokens=10,
        length_penalty=length_penalty, early_stopping=early_stopping,
    )
    outputs = run_all(make_engine(tiny_llama_dir), prompts, params, check_every_step=True)
    for prompt, out in zip(prompts, outputs):
        assert [c.token_ids for c in out.outputs] == hf_beam(hf_model, prompt, width, 10, length_penalty, early_stopping)


def test_beams_share_the_prompt_blocks(tiny_llama_dir):
    prompt = random_prompts(1, seed=30, low=40, high=40)[0]
    engine = make_engine(tiny_llama_dir, enable_prefix_caching=False)
    params = SamplingParams(n=4, use_beam_search=True, temperature=0.0, max_tokens=8, ignore_eos=True)
    engine.add_request("beam", prompt, params)
    for _ in range(3):
        engine.step()
        engine.kv.check_invariants()
    live = len(engine.requests["beam"].live_seqs)
    assert live == 4
    assert engine.kv.num_used_blocks <= len(prompt) // 4 + 4 * 1  # prompt blocks once + one tail per beam
    engine.abort_request("beam")
    assert engine.kv.num_used_blocks == 0


def test_contiguous_reservation_admits_fewer_but_gives_the_same_tokens(tiny_llama_dir):
    prompts = random_prompts(8, seed=40, low=10, high=20)
    params = SamplingParams(max_tokens=8, **GREEDY)
    small = dict(num_blocks=64, max_model_len=64, max_num_batched_tokens=512)
    paged = make_engine(tiny_llama_dir, **small)
    contiguous = make_engine(tiny_llama_dir, allocator="contiguous", **small)
    for engine in (paged, contiguous):
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, params)
        engine.step()
    # 64 blocks x 4 slots = 256 slots = four 64-slot reservations; paged admits all eight
    assert len(contiguous.scheduler.running) == 4
    assert len(paged.scheduler.running) == 8
    assert (contiguous.stats().slots_reserved, paged.stats().slots_reserved) == (256, 0)  # the whole pool held
    fresh = make_engine(tiny_llama_dir, allocator="contiguous", **small)
    again = make_engine(tiny_llama_dir, **small)
    assert tokens(run_all(fresh, prompts, params)) == tokens(run_all(again, prompts, params))
    assert not fresh.scheduler.reservations.allocator.reservations() and fresh.stats().slots_reserved == 0


def test_a_contiguous_pool_too_small_for_one_max_length_run_is_refused_at_construction(tiny_llama_dir):
    with pytest.raises(InvalidInputError, match=r'allocator="contiguous" reserves max_model_len \(65\) slots for '
                                                r"every sequence but the pool holds 64; lower max_model_len"):
        make_engine(tiny_llama_dir, allocator="contiguous", num_blocks=16, max_model_len=65)
    make_engine(tiny_llama_dir, allocator="contiguous", num_blocks=16, max_model_len=64)


def test_warm_up_leaves_the_engine_as_new(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    steps, execute = [], engine.executor.execute
    engine.executor.execute = lambda copies, seqs, greedy: steps.append(seqs) or execute(copies, seqs, greedy)
    engine.warm_up()
    del engine.executor.execute
    assert [[(len(s.token_ids), s.num_cached) for s in seqs] for seqs in steps] == [[(31, 0)], [(1, 31)]]  # + a decode
    assert engine.kv.num_used_blocks == 0 and engine.stats().prompt_tokens_total == 0
    engine.kv.check_invariants()
    (out,) = run_all(engine, [[5, 6, 7, 8, 9]], SamplingParams(max_tokens=4, **GREEDY))
    assert out.outputs[0].token_ids == tokens(run_all(make_engine(tiny_llama_dir), [[5, 6, 7, 8, 9]],
                                                     SamplingParams(max_tokens=4, **GREEDY)))[0]


def test_preempting_forked_requests_keeps_their_tokens_with_prefix_caching(tiny_llama_dir):
    """A block is hashed as it is allocated (a prompt admitted in the same step may hit it). A request preempted
    in the pass that allocated its new blocks must take their hashes away with them, or its recomputation hits
    blocks whose K/V were never written (n > 1 and beam requests: one sequence allocated, the next preempted)."""
    prompts = random_prompts(6, seed=5, low=8, high=12)
    kinds = [SamplingParams(max_tokens=15, **GREEDY),
             SamplingParams(n=3, temperature=0.8, seed=1, max_tokens=10, ignore_eos=True),
             SamplingParams(use_beam_search=True, beam_width=3, max_tokens=8, **GREEDY)]
    params = kinds * 2
    reference = run_all(make_engine(tiny_llama_dir), prompts, params)
    small = make_engine(tiny_llama_dir, num_blocks=30)
    squeezed = run_all(small, prompts, params, check_every_step=True)
    assert [o.metrics.num_preemptions for o in squeezed[3:]] != [0, 0, 0], "the later requests were to be preempted"
    assert [[c.token_ids for c in o.outputs] for o in squeezed] == [[c.token_ids for c in o.outputs] for o in reference]


def test_a_swap_preemption_saves_the_kv_of_a_copy_not_yet_made(tiny_llama_dir):
    """Allocating the first sequence of an n = 3 request copies its shared partial tail (the copy is queued for
    the step); the second sequence does not fit, so the request itself is preempted. Its swap must save the
    tail's K/V from the copy's source: the target was never written."""
    prompts = [list(range(100, 121)), [7, 8, 9, 10, 11]]
    params = [SamplingParams(max_tokens=3, **GREEDY), SamplingParams(n=3, max_tokens=4, **GREEDY)]
    reference = run_all(make_engine(tiny_llama_dir, enable_prefix_caching=False), prompts, params)
    for mode in ("recompute", "swap"):
        small = make_engine(tiny_llama_dir, num_blocks=9, enable_prefix_caching=False, preemption_mode=mode)
        squeezed = run_all(small, prompts, params, check_every_step=True)
        assert small.stats().num_preemptions >= 1, mode
        assert [[c.token_ids for c in o.outputs] for o in squeezed] == [[c.token_ids for c in o.outputs]
                                                                         for o in reference], mode


def test_readmitted_beams_compute_their_tokens_in_one_step(tiny_llama_dir):
    """After a recompute preemption each beam has its own prefix hit; chunked apart, some beams reached their
    last token (and needed logits) in a step where others did not, and the beam step failed."""
    prompts = [[40], [169, 381, 290, 97, 245, 264, 40, 174, 354, 75, 265, 323, 377]]
    params = [SamplingParams(temperature=1.0, seed=13505, n=3, max_tokens=5, ignore_eos=True),
              SamplingParams(use_beam_search=True, beam_width=3, n=3, max_tokens=5, **GREEDY)]
    reference = run_all(make_engine(tiny_llama_dir, block_size=16), prompts, params)
    small = make_engine(tiny_llama_dir, num_blocks=6, block_size=16, max_num_batched_tokens=16)
    squeezed = run_all(small, prompts, params, check_every_step=True)
    assert squeezed[1].metrics.num_preemptions >= 1 or squeezed[0].metrics.num_preemptions >= 1
    assert [c.token_ids for c in squeezed[1].outputs] == [c.token_ids for c in reference[1].outputs]


def test_an_admission_undone_does_not_count_as_a_prefix_lookup(tiny_llama_dir):
    """A request whose sequences do not all fit is undone and admitted again in a later step; the prefix cache's
    counters hold the admissions that stayed, not every attempt."""
    engine = make_engine(tiny_llama_dir, num_blocks=8, block_size=16, max_num_batched_tokens=16)
    kv, kept, undone, latest = engine.kv, [], [], {}
    allocate, undo = kv.allocate, kv.undo_admission

    def spy_allocate(seq_id, token_ids, num_new, prefix=None, extra_keys=(), count_lookup=True):
        new = not kv.has_seq(seq_id)
        result = allocate(seq_id, token_ids, num_new, prefix, extra_keys, count_lookup)
        if new and result is not None:  # a counted lookup, or None for a readmission's (not counted)
            latest[seq_id] = (seq_id, len(token_ids), prefix.num_tokens if prefix else 0) if count_lookup else None
            kept.extend([latest[seq_id]] if count_lookup else [])
        return result

    def spy_undo(seq_id, num_computed):
        undone.append(latest.pop(seq_id))
        if undone[-1] is not None:
            kept.remove(undone[-1])
        undo(seq_id, num_computed)

    kv.allocate, kv.undo_admission = spy_allocate, spy_undo
    shared = [56, 328, 228, 250, 232, 90, 289, 229]
    long_tail = [148, 236, 246, 39, 122, 222, 298, 267, 185, 247, 320, 93, 61, 101]
    run_all(engine, [shared + long_tail, shared + [202, 99, 22]],
            [SamplingParams(temperature=0.7, seed=37973, max_tokens=23),
             SamplingParams(temperature=1.0, seed=269492, n=4, max_tokens=8, ignore_eos=True)])
    assert undone, "an admission was to be undone"
    stats = engine.stats()
    assert (stats.prefix_queries_tokens, stats.prefix_hits_tokens) == (sum(k[1] for k in kept), sum(k[2] for k in kept))
