"""vLLM's request extras through the server, on a tiny random model: prompt_logprobs, return_token_ids,
return_tokens_as_token_ids and use_beam_search, each against what the engine gives offline or what the
response says elsewhere (a stream joined, the echoed prompt's logprobs, /tokenize)."""

from __future__ import annotations

import json

import httpx
import pytest

from pagedllm.sampling_params import SamplingParams
from server_harness import RunningServer, parse_stream, start_server

PROMPT = [5, 17, 42, 99, 7, 230, 64]  # token ids: no tokenizer round trip between offline and served
MSG = [{"role": "user", "content": "hello there"}]
BEAM = {"use_beam_search": True, "n": 3, "max_tokens": 6}


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    from conftest import real_config

    from pagedllm.engine.llm_engine import LLMEngine

    return LLMEngine(real_config(tiny_llama_dir))


@pytest.fixture(scope="module")
def offline_beams(engine) -> list[list[int]]:
    """The engine's own beams for PROMPT, before it is served."""
    engine.add_request("offline", PROMPT, SamplingParams(use_beam_search=True, n=3, max_tokens=6, temperature=0))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    return [c.token_ids for c in outputs[-1].outputs]


@pytest.fixture(scope="module")
def server(engine, offline_beams) -> RunningServer:
    running = start_server(engine)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def http(server: RunningServer):
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def post(http: httpx.Client, path: str, **body) -> dict:
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def chunks(http: httpx.Client, path: str, **body) -> list[dict]:
    response = http.post(path, json={**body, "stream": True})
    assert response.status_code == 200, response.text
    events, done = parse_stream(response.text.splitlines())
    assert done
    return events


def test_prompt_logprobs_are_the_echoed_prompts_in_vllms_shape(http: httpx.Client) -> None:
    """Per prompt token after the first: the token itself (its logprob and rank) and its top-k (ranks 1..k), the
    same values the echoed prompt's logprobs give (named by id there: this tokenizer reads many tokens alike)."""
    base = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    shown = post(http, "/v1/completions", **base, prompt_logprobs=2)["choices"][0]["prompt_logprobs"]
    echoed = post(http, "/v1/completions", **base, echo=True, logprobs=2,
                  return_tokens_as_token_ids=True)["choices"][0]["logprobs"]
    assert len(shown) == len(PROMPT) and shown[0] is None
    for token, entry, top in zip(PROMPT[1:], shown[1:], echoed["top_logprobs"][1:]):
        assert list(entry)[0] == str(token)
        rank = entry[str(token)]["rank"]
        assert {e["rank"] for e in entry.values()} == {1, 2} | {rank} and len(entry) == 2 + (rank > 2)
        assert {f"token_id:{t}": pytest.approx(e["logprob"]) for t, e in entry.items()} == top


def test_prompt_logprobs_zero_give_the_prompt_tokens_alone(http: httpx.Client) -> None:
    shown = post(http, "/v1/completions", prompt=PROMPT, max_tokens=1, prompt_logprobs=0)["choices"][0]
    assert [list(entry) for entry in shown["prompt_logprobs"][1:]] == [[str(t)] for t in PROMPT[1:]]


def test_chat_prompt_logprobs_and_prompt_token_ids_are_the_responses(http: httpx.Client) -> None:
    body = post(http, "/v1/chat/completions", messages=MSG, max_tokens=2, prompt_logprobs=1, return_token_ids=True)
    ids = http.post("/tokenize", json={"messages": MSG}).json()["tokens"]
    assert body["prompt_token_ids"] == ids and len(ids) == body["usage"]["prompt_tokens"]
    assert body["prompt_logprobs"][0] is None
    assert [list(entry)[0] for entry in body["prompt_logprobs"][1:]] == [str(t) for t in ids[1:]]
    assert len(body["choices"][0]["token_ids"]) == body["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("path,base", [("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions",
                                                                                 {"messages": MSG})])
@pytest.mark.parametrize("extra", [{"stream": True, "prompt_logprobs": 1}, {"prompt_logprobs": -1},
                                   {"prompt_logprobs": 21}])
def test_prompt_logprobs_that_cannot_be_given_are_400(http: httpx.Client, path: str, base: dict, extra: dict) -> None:
    response = http.post(path, json={**base, "max_tokens": 2, **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "prompt_logprobs"


def test_completion_token_ids_whole_and_streamed_agree(http: httpx.Client) -> None:
    base = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "ignore_eos": True, "n": 2,
            "return_token_ids": True}
    whole = post(http, "/v1/completions", **base)["choices"]
    streamed: dict[int, list[int]] = {}
    firsts: dict[int, list[int] | None] = {}
    for chunk in chunks(http, "/v1/completions", **base):
        (choice,) = chunk["choices"]
        firsts.setdefault(choice["index"], choice["prompt_token_ids"])
        streamed.setdefault(choice["index"], []).extend(choice["token_ids"])
    assert [c["token_ids"] for c in whole] == [streamed[0], streamed[1]] and len(streamed[0]) == 5
    assert [c["prompt_token_ids"] for c in whole] == [PROMPT, PROMPT] and firsts == {0: PROMPT, 1: PROMPT}


def test_an_echoed_stream_sends_the_prompt_ids_with_the_prompt(http: httpx.Client) -> None:
    events = chunks(http, "/v1/completions", prompt=PROMPT, max_tokens=2, echo=True, return_token_ids=True)
    first, rest = events[0]["choices"][0], [e["choices"][0] for e in events[1:]]
    assert (first["prompt_token_ids"], first["token_ids"]) == (PROMPT, [])
    assert all(c["prompt_token_ids"] is None for c in rest) and sum(len(c["token_ids"]) for c in rest) == 2


def test_chat_token_ids_whole_and_streamed_agree(http: httpx.Client) -> None:
    base = {"messages": MSG, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    whole = post(http, "/v1/chat/completions", **base)
    events = chunks(http, "/v1/chat/completions", **base)
    assert events[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    streamed = [t for e in events[1:] for c in e["choices"] for t in c["token_ids"]]
    assert streamed == whole["choices"][0]["token_ids"] and len(streamed) == 4


def test_chat_prompt_text_is_the_templated_prompt_whole_and_in_the_first_chunk(http: httpx.Client,
                                                                              engine) -> None:
    base = {"messages": MSG, "max_tokens": 2, "temperature": 0, "return_prompt_text": True, "n": 2}
    whole = post(http, "/v1/chat/completions", **base)
    templated = engine.tokenizer.apply_chat_template(MSG, tokenize=False, add_generation_prompt=True)
    assert whole["prompt_text"] == templated
    events = chunks(http, "/v1/chat/completions", **base)
    assert events[0]["prompt_text"] == templated and all("prompt_text" not in e for e in events[1:])
    assert "prompt_text" not in post(http, "/v1/chat/completions", **{**base, "return_prompt_text": False})


def test_tokens_as_token_ids_name_every_logprob_by_its_id(http: httpx.Client) -> None:
    base = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "ignore_eos": True, "logprobs": 2,
            "return_token_ids": True, "return_tokens_as_token_ids": True}
    choice = post(http, "/v1/completions", **base)["choices"][0]
    names = [f"token_id:{t}" for t in choice["token_ids"]]
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == names
    assert all(key.startswith("token_id:") for top in logprobs["top_logprobs"] for key in top)
    assert logprobs["text_offset"] == [sum(map(len, names[:i])) for i in range(3)]
    chat = post(http, "/v1/chat/completions", messages=MSG, max_tokens=2, temperature=0, ignore_eos=True,
                logprobs=True, top_logprobs=1, return_token_ids=True, return_tokens_as_token_ids=True)["choices"][0]
    assert [e["token"] for e in chat["logprobs"]["content"]] == [f"token_id:{t}" for t in chat["token_ids"]]


NAMED = [300, 5, 77, 5]  # token ids whose logprobs vLLM's logprob_token_ids asks for (5 twice: given once)


def test_logprob_token_ids_give_the_token_then_the_named_ones_in_vllms_shapes(http: httpx.Client) -> None:
    """Each position's top_logprobs: the token itself, then the named tokens in order (vLLM's shapes); their values
    those of the same tokens in a top-20 answer where it has them, and the same whole and streamed."""
    base = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    named = post(http, "/v1/completions", **base, logprobs=0, logprob_token_ids=NAMED)["choices"][0]
    top = post(http, "/v1/completions", **base, logprobs=20)["choices"][0]
    assert named["token_ids"] == top["token_ids"]
    texts = [post(http, "/detokenize", tokens=[t])["prompt"] for t in (300, 5, 77)]
    for token, entry, wide in zip(named["logprobs"]["tokens"], named["logprobs"]["top_logprobs"],
                                  top["logprobs"]["top_logprobs"]):
        assert list(entry) == list(dict.fromkeys([token, *texts]))
        assert all(entry[text] == pytest.approx(wide[text], abs=1e-4) for text in entry if text in wide)
    streamed = [e["choices"][0]["logprobs"] for e in chunks(http, "/v1/completions", **base, logprobs=0,
                                                              logprob_token_ids=NAMED) if e["choices"]]
    joined = [t for lp in streamed if lp for t in lp["top_logprobs"]]
    assert [list(t) for t in joined] == [list(t) for t in named["logprobs"]["top_logprobs"]]
    assert [v for t in joined for v in t.values()] == pytest.approx(
        [v for t in named["logprobs"]["top_logprobs"] for v in t.values()], abs=1e-4)
    chat = {"messages": MSG, "max_tokens": 3, "temperature": 0, "ignore_eos": True, "logprobs": True}
    content = post(http, "/v1/chat/completions", **chat, logprob_token_ids=NAMED)["choices"][0]["logprobs"]["content"]
    for entry in content:
        assert [t["token"] for t in entry["top_logprobs"]] == list(dict.fromkeys([entry["token"], *texts]))
        assert entry["top_logprobs"][0]["logprob"] == entry["logprob"]
    joined = [e for c in chunks(http, "/v1/chat/completions", **chat, logprob_token_ids=NAMED) if c["choices"]
              and c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]
    # the stream's prompt comes from the prefix cache, attended in other pieces: its floats may differ a little
    assert [[t["token"] for t in e["top_logprobs"]] for e in joined] == [
        [t["token"] for t in e["top_logprobs"]] for e in content]
    assert [t["logprob"] for e in joined for t in e["top_logprobs"]] == pytest.approx(
        [t["logprob"] for e in content for t in e["top_logprobs"]], abs=1e-4)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": PROMPT, "logprob_token_ids": [5]}, "logprob_token_ids"),  # logprobs not set
    ("/v1/chat/completions", {"messages": MSG, "logprob_token_ids": [5], "logprobs": False}, "logprob_token_ids"),
    ("/v1/completions", {"prompt": PROMPT, "logprobs": 1, "logprob_token_ids": list(range(129))}, "logprob_token_ids"),
    ("/v1/completions", {"prompt": PROMPT, "logprobs": 1, "logprob_token_ids": [10**6]}, "logprob_token_ids"),
    ("/v1/completions", {"prompt": PROMPT, "logprobs": 1, "logprob_token_ids": [5], "echo": True, "max_tokens": 0},
     "logprob_token_ids"),
    ("/v1/completions", {"prompt": PROMPT, **BEAM, "logprobs": None, "logprob_token_ids": [5]}, "logprob_token_ids")])
def test_logprob_token_ids_that_cannot_be_honoured_are_400s(http: httpx.Client, path: str, body: dict,
                                                            param: str) -> None:
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_beam_search_answers_the_engines_own_beams(http: httpx.Client, offline_beams: list[list[int]]) -> None:
    body = post(http, "/v1/completions", prompt=PROMPT, return_token_ids=True, **BEAM)
    assert [c["token_ids"] for c in body["choices"]] == offline_beams
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"]["completion_tokens"] == sum(map(len, offline_beams))


def test_beam_search_over_two_prompts_gives_each_its_beams(http: httpx.Client) -> None:
    body = post(http, "/v1/completions", prompt=[PROMPT, PROMPT[:4]], return_token_ids=True, **BEAM)
    assert [c["index"] for c in body["choices"]] == list(range(6))
    assert [c["prompt_token_ids"] for c in body["choices"]] == [PROMPT] * 3 + [PROMPT[:4]] * 3


def test_a_streamed_chat_beam_search_sends_each_beam_whole(http: httpx.Client) -> None:
    whole = post(http, "/v1/chat/completions", messages=MSG, **BEAM)["choices"]
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for event in chunks(http, "/v1/chat/completions", messages=MSG, **BEAM):
        for choice in event["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + (choice["delta"].get("content") or "")
            if choice["finish_reason"]:
                finishes[choice["index"]] = choice["finish_reason"]
    assert [texts[i] for i in range(3)] == [c["message"]["content"] for c in whole]
    assert [finishes[i] for i in range(3)] == [c["finish_reason"] for c in whole]


@pytest.mark.parametrize("extra,param", [({"stream": True}, "use_beam_search"), ({"temperature": 0.5}, "temperature"),
                                         ({"logprobs": 1}, "logprobs"), ({"stop": ["a"]}, "stop")])
def test_beam_search_refuses_what_it_cannot_honour(http: httpx.Client, extra: dict, param: str) -> None:
    response = http.post("/v1/completions", json={"prompt": PROMPT, **BEAM, **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_beam_search_at_temperature_one_is_the_same_search(http: httpx.Client, offline_beams) -> None:
    """vLLM's beam search runs at temperature 1 unless told otherwise; its scores are the model's logprobs."""
    body = post(http, "/v1/completions", prompt=PROMPT, temperature=1.0, return_token_ids=True, **BEAM)
    assert [c["token_ids"] for c in body["choices"]] == offline_beams


def test_an_abandoned_beam_stream_leaves_nothing_behind(server: RunningServer) -> None:
    body = {"messages": MSG, "use_beam_search": True, "n": 3, "max_tokens": 200, "ignore_eos": True,
            "stream": True}
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            next(response.iter_lines())  # the first role chunk, then hang up
    stats = server.wait_idle(timeout=30)
    assert (stats.num_running, stats.num_waiting, stats.blocks_used) == (0, 0, 0)


ENDPOINTS = [("/v1/completions", {"prompt": PROMPT, "max_tokens": 3}, "cmpl-"),
             ("/v1/chat/completions", {"messages": MSG, "max_tokens": 3}, "chatcmpl-"),
             ("/v1/responses", {"input": "hello there", "max_output_tokens": 3}, "resp_")]


@pytest.mark.parametrize("path,body,prefix", ENDPOINTS)
def test_a_request_id_names_the_response_whole_and_streamed(http: httpx.Client, path: str, body: dict,
                                                            prefix: str) -> None:
    for _ in range(2):  # an id may come again once its first request has finished
        assert post(http, path, **body, request_id="job-7", session_id="s1")["id"] == prefix + "job-7"
    streamed = http.post(path, json={**body, "request_id": "job-8", "stream": True})
    assert streamed.status_code == 200
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    ids = {event["response"]["id"] if "response" in event else event.get("id") for event in events}
    assert ids - {None} == {prefix + "job-8"}  # a Responses stream names it in the events that carry the response


@pytest.mark.parametrize("path,body,prefix", ENDPOINTS)
def test_an_x_request_id_header_names_the_response_before_the_body(http: httpx.Client, path: str, body: dict,
                                                                   prefix: str) -> None:
    response = http.post(path, json={**body, "request_id": "from-body"}, headers={"X-Request-Id": "from-header"})
    assert response.status_code == 200 and response.json()["id"] == prefix + "from-header"


NOT_TAKEN = ["vllm_xargs", "watermarking",
             "return_token_offsets", "prompt_embeds", "kv_transfer_params",
             "ec_transfer_params", "mm_payload", "mm_processor_kwargs", "media_io_kwargs", "return_mm_kwargs",
             "routed_experts_prompt_start"]


@pytest.mark.parametrize("path,body", [e[:2] for e in ENDPOINTS[:2]])
@pytest.mark.parametrize("field", NOT_TAKEN)
def test_vllms_fields_this_server_cannot_honour_are_400s_naming_them(http: httpx.Client, path: str, body: dict,
                                                                     field: str) -> None:
    response = http.post(path, json={**body, field: 1})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field


@pytest.mark.parametrize("path,body", [e[:2] for e in ENDPOINTS[:2]])
def test_spaces_between_special_tokens_is_taken_only_as_its_default(http: httpx.Client, path: str, body: dict):
    assert http.post(path, json={**body, "spaces_between_special_tokens": True}).status_code == 200
    response = http.post(path, json={**body, "spaces_between_special_tokens": False})
    assert response.status_code == 400 and response.json()["error"]["param"] == "spaces_between_special_tokens"


def test_a_request_id_may_name_requests_that_run_together() -> None:
    from conftest import fake_config
    from fake_serving_engine import FakeEngine

    running = start_server(FakeEngine(fake_config(), step_delay=0.02))  # 20 tokens: about half a second
    body = {"prompt": "hello", "max_tokens": 20, "ignore_eos": True, "request_id": "dup"}
    try:
        with httpx.Client(base_url=running.base_url, timeout=60) as client:
            with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as first:
                lines = first.iter_lines()
                next(lines)  # the first request runs
                second = client.post("/v1/completions", json=body)
                rest = [line for line in lines if line]
            assert second.status_code == 200 and second.json()["id"] == "cmpl-dup"
            assert second.json()["usage"]["completion_tokens"] == 20
            assert rest[-1] == "data: [DONE]" and sum('"finish_reason":"length"' in line for line in rest) == 1
        assert running.wait_idle(timeout=30).num_running == 0
    finally:
        running.stop()


@pytest.mark.parametrize("path,body", [e[:2] for e in ENDPOINTS[:2]])
def test_a_stream_interval_gathers_that_many_tokens_a_chunk(http: httpx.Client, path: str, body: dict) -> None:
    asked = {**body, "max_tokens": 11, "ignore_eos": True, "n": 2, "temperature": 0, "return_token_ids": True}
    whole = post(http, path, **asked)["choices"]
    per_choice: dict[int, list[list[int]]] = {0: [], 1: []}
    texts = {0: "", 1: ""}
    for event in chunks(http, path, **asked, stream_interval=4):
        for choice in event["choices"]:
            if choice.get("token_ids"):
                per_choice[choice["index"]].append(choice["token_ids"])
            texts[choice["index"]] += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    for index, pieces in per_choice.items():
        assert [len(p) for p in pieces] == [1, 4, 4, 2]  # the first token at once, then 4 a chunk, the rest last
        assert sum(pieces, []) == whole[index]["token_ids"]
        assert texts[index] == whole[index].get("text", (whole[index].get("message") or {}).get("content"))


def test_a_stream_interval_below_1_is_a_400(http: httpx.Client) -> None:
    response = http.post("/v1/completions", json={"prompt": PROMPT, "stream": True, "stream_interval": 0})
    assert response.status_code == 400 and response.json()["error"]["param"] == "stream_interval"
