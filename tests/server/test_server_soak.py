"""The soak benchmark's parts: one burst against the fake engine, the metrics scrape, the verdict."""

from __future__ import annotations

import asyncio
import random

import httpx

from conftest import fake_config
from fake_serving_engine import FakeEngine
from pagedllm.bench.soak import TAIL, BurstRow, judge, scrape
from pagedllm.bench.soak_burst import BAD_BODIES, BurstPlan, run_burst
from server_harness import start_server


def test_one_burst_against_the_fake_engine() -> None:
    server = start_server(FakeEngine(fake_config(max_model_len=256)))
    try:
        async def burst():
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
                plan = BurstPlan(streams=8, disconnects=3, bad_requests=len(BAD_BODIES), max_tokens=40,
                                 model=server.model)
                return await run_burst(client, plan, random.Random(0))

        result = asyncio.run(burst())
        stats = server.wait_idle()
    finally:
        server.stop()
    assert result.errors == []
    assert (result.completed, result.disconnected, result.refused) == (5, 3, len(BAD_BODIES))
    assert (stats.num_running, stats.num_waiting, stats.blocks_used) == (0, 0, 0)


def test_scrape_reads_sample_values() -> None:
    text = ('# HELP pagedllm_kv_blocks_used x\n# TYPE pagedllm_kv_blocks_used gauge\n'
            'pagedllm_kv_blocks_used{model_name="m"} 3.0\npagedllm_num_preemptions_total{model_name="m"} 7.0\n')
    assert scrape(text) == {"pagedllm_kv_blocks_used": 3.0, "pagedllm_num_preemptions_total": 7.0}


def rows(rss: list[float], blocks: int = 0) -> list[BurstRow]:
    return [BurstRow(i + 1, value, blocks if i == 3 else 0, 0, 0, 0, 48, 16, 16, 0, 1.0)
            for i, value in enumerate(rss)]


def test_verdict() -> None:
    flat = [1000.0 + 50 * min(i, 4) for i in range(2 * TAIL)]
    assert judge(rows(flat), 16.0)["ok"]
    growing = flat[:-1] + [flat[-1] + 17]
    assert not judge(rows(growing), 16.0)["ok"]
    assert judge(rows(growing), 16.0)["rss_growth_last_bursts_mib"] == 17.0
    assert not judge(rows(flat, blocks=2), 16.0)["ok"]
    assert judge(rows(flat, blocks=2), 16.0)["bursts_with_leaks"] == [4]
    assert not judge(rows(flat[:TAIL]), 16.0)["ok"]  # too few bursts for a verdict


def test_a_burst_of_the_features_mix_against_the_real_engine(tiny_llama_dir) -> None:
    """Every endpoint and feature at once on the tiny model with a small pool (it preempts): all answered with a
    200 (streams to their end, or hung up), and nothing left behind."""
    from conftest import real_config

    from pagedllm.engine.llm_engine import LLMEngine

    config = real_config(tiny_llama_dir)
    config.num_blocks = 96
    server = start_server(LLMEngine(config), responses_store_size=64)  # stored and background responses are drawn
    try:
        async def burst():
            async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
                plan = BurstPlan(streams=48, disconnects=6, bad_requests=4, max_tokens=24, model=server.model,
                                 mix="features")
                return await run_burst(client, plan, random.Random(1))

        result = asyncio.run(burst())
        stats = server.wait_idle(timeout=60)
    finally:
        server.stop()
    assert result.errors == []
    assert result.completed + result.disconnected == 48 and result.completed > 30 and result.refused == 4
    assert (stats.num_running, stats.num_waiting, stats.blocks_used) == (0, 0, 0) and stats.num_preemptions > 0
