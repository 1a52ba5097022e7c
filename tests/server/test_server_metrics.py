"""/metrics parses as Prometheus text and its counters move as requests run."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from server_harness import RunningServer

EXPECTED = {
    "pagedllm_num_requests_running", "pagedllm_num_requests_waiting", "pagedllm_kv_blocks_total",
    "pagedllm_kv_blocks_used", "pagedllm_kv_block_usage_ratio", "pagedllm_kv_token_usage_ratio",
    "pagedllm_kv_tokens_stored", "pagedllm_kv_blocks_cached_free", "pagedllm_prefix_cache_queries_tokens",
    "pagedllm_prefix_cache_hits_tokens", "pagedllm_num_preemptions", "pagedllm_prompt_tokens",
    "pagedllm_generation_tokens", "pagedllm_request_success", "pagedllm_time_to_first_token_seconds",
    "pagedllm_time_per_output_token_seconds", "pagedllm_e2e_request_latency_seconds",
    "pagedllm_request_queue_time_seconds",
}


def scrape(server: RunningServer) -> dict[str, float]:
    response = httpx.get(server.base_url + "/metrics", timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    families = list(text_string_to_metric_families(response.text))
    assert EXPECTED <= {f.name for f in families}
    values: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def test_counters_move_as_requests_run(server: RunningServer) -> None:
    before = scrape(server)
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        for i in range(3):
            r = client.post("/v1/completions", json={"prompt": f"count {i}", "max_tokens": 5, "ignore_eos": True})
            assert r.status_code == 200
    server.wait_idle()
    after = scrape(server)
    grew = lambda name, by=1.0: after[name] - before.get(name, 0.0) >= by  # noqa: E731
    assert grew("pagedllm_generation_tokens_total", 15)
    assert grew("pagedllm_prompt_tokens_total", 3)
    assert grew("pagedllm_prefix_cache_queries_tokens_total", 3)
    assert grew("pagedllm_request_success_total", 3)
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                      "time_per_output_token_seconds"):
        assert grew(f"pagedllm_{histogram}_count", 3 if histogram != "time_per_output_token_seconds" else 1)
    assert after["pagedllm_kv_blocks_total"] == server.stats().num_blocks
    with httpx.Client(base_url=server.base_url, timeout=30) as client:  # one request, three completions
        body = {"prompt": "three", "n": 3, "max_tokens": 4, "temperature": 1.0, "seed": 3}
        assert client.post("/v1/completions", json=body).status_code == 200
    server.wait_idle()
    assert scrape(server)["pagedllm_request_success_total"] - after["pagedllm_request_success_total"] == 3
    assert after["pagedllm_num_requests_running"] == 0 and after["pagedllm_kv_blocks_used"] == 0


def test_kv_snapshot_endpoint(server: RunningServer) -> None:
    snapshot = httpx.get(server.base_url + "/v1/kv", timeout=10).json()
    assert snapshot["num_blocks"] == len(snapshot["blocks"]) == server.stats().num_blocks
    assert {"id", "state", "ref_cnt", "filled", "owners"} <= set(snapshot["blocks"][0])
    assert {"waste", "running", "waiting", "block_size", "counts", "requests"} <= set(snapshot)
    window = httpx.get(server.base_url + "/v1/kv", params={"offset": 2, "limit": 3}, timeout=10).json()
    assert [b["id"] for b in window["blocks"]] == [2, 3, 4] and window["counts"] == snapshot["counts"]
    for bad in ({"limit": 0}, {"offset": -1}, {"limit": "abc"}):
        response = httpx.get(server.base_url + "/v1/kv", params=bad, timeout=10)
        assert response.status_code == 400 and response.json()["error"]["param"] == next(iter(bad)), response.text


def test_health(server: RunningServer) -> None:
    response = httpx.get(server.base_url + "/health", timeout=10)
    assert response.status_code == 200 and response.json()["status"] == "ok"


def test_vllms_dashboard_metrics_are_the_same_figures_under_vllms_names(server: RunningServer) -> None:
    from pagedllm.metrics import PREFIX, VLLM_NAMES

    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        assert client.post("/v1/completions", json={"prompt": "alias", "max_tokens": 4}).status_code == 200
    server.wait_idle()
    values = scrape(server)
    for ours, theirs in VLLM_NAMES.items():
        mine = {name[len(PREFIX + ours):]: v for name, v in values.items() if name.startswith(PREFIX + ours)}
        aliased = {name[len(theirs):]: v for name, v in values.items() if name.startswith(theirs)}
        assert mine and aliased == mine, ours  # every sample (_total, _count, _sum, _bucket), the same value
    assert values["vllm:generation_tokens_total"] >= 4
