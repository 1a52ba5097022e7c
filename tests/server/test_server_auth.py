"""--api-key: every route but /health and /ping needs the key; the dashboard opens once with ?api_key=."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator

import httpx
import pytest
from openai import AuthenticationError, OpenAI

from conftest import fake_config
from fake_serving_engine import FakeEngine
from pagedllm.entrypoints import serve_cmd
from pagedllm.entrypoints.server.auth import COOKIE
from server_harness import RunningServer, start_server

KEY = "test-key-7f3a"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
PROTECTED = [("GET", "/v1/models", None), ("GET", "/v1/models/fake-model", None), ("GET", "/metrics", None),
             ("GET", "/v1/kv", None), ("GET", "/dashboard", None), ("GET", "/dashboard.js", None),
             ("GET", "/openapi.json", None), ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2}),
             ("POST", "/v1/chat/completions", CHAT), ("POST", "/reset_prefix_cache", None),
             ("POST", "/v1/responses", {"input": "x", "max_output_tokens": 2}), ("GET", "/load", None),
             ("GET", "/no/such/route", None)]


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = start_server(FakeEngine(fake_config()), api_key=KEY)
    yield running
    running.stop()


@pytest.fixture()
def http(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


def assert_401(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
    assert KEY not in response.text


@pytest.mark.parametrize("method,path,body", PROTECTED, ids=[f"{m} {p}" for m, p, _ in PROTECTED])
@pytest.mark.parametrize("auth", [None, "Bearer wrong-key", f"Basic {KEY}", f"Bearer {KEY}x", "Bearer"])
def test_every_route_but_health_needs_the_key(http: httpx.Client, method: str, path: str, body: dict | None,
                                              auth: str | None) -> None:
    headers = {} if auth is None else {"Authorization": auth}
    assert_401(http.request(method, path, json=body, headers=headers))


@pytest.mark.parametrize("method,path,body", PROTECTED[:-1], ids=[f"{m} {p}" for m, p, _ in PROTECTED[:-1]])
def test_the_key_opens_every_route(http: httpx.Client, method: str, path: str, body: dict | None) -> None:
    response = http.request(method, path, json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 200, response.text


def test_health_is_open(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    assert http.get("/ping").status_code == 200 and http.post("/ping").json() == {"status": "ok"}


def test_openai_client_with_and_without_the_key(server: RunningServer) -> None:
    good = OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0)
    reply = good.chat.completions.create(model=server.model, messages=CHAT["messages"], max_tokens=3)
    assert reply.choices[0].message.content
    bad = OpenAI(base_url=f"{server.base_url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(AuthenticationError):
        bad.models.list()


def test_dashboard_opens_with_the_key_in_the_url(http: httpx.Client) -> None:
    first = http.get("/dashboard", params={"api_key": KEY})
    assert first.status_code == 303 and first.headers["location"] == "/dashboard"
    cookie = first.headers["set-cookie"]
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower() and KEY not in cookie
    # httpx keeps the cookie, as a browser would; the page and what it polls now load
    page = http.get("/dashboard")
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert http.get("/dashboard.js").status_code == 200
    assert http.get("/v1/kv").json()["num_blocks"] > 0


def test_wrong_key_in_the_url_gets_no_cookie(http: httpx.Client) -> None:
    response = http.get("/dashboard", params={"api_key": "wrong"})
    assert_401(response)
    assert COOKIE not in http.cookies


def test_dashboard_cookie_cannot_post(http: httpx.Client) -> None:
    http.get("/dashboard", params={"api_key": KEY})
    assert COOKIE in http.cookies
    assert_401(http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}))


@pytest.mark.parametrize("host,warned", [("0.0.0.0", True), ("::", True), ("192.168.1.5", True),
                                         ("example.org", True), ("127.0.0.1", False), ("::1", False),
                                         ("localhost", False), ("127.1.2.3", False)])
def test_startup_warns_when_exposed_without_a_key(caplog: pytest.LogCaptureFixture, host: str,
                                                  warned: bool) -> None:
    with caplog.at_level(logging.WARNING, logger="pagedllm.server"):
        serve_cmd.warn_if_exposed(host, 8000, api_key=None)
        serve_cmd.warn_if_exposed(host, 8000, api_key=KEY)
    assert len(caplog.records) == (1 if warned else 0)


def test_api_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    monkeypatch.setenv(serve_cmd.API_KEY_ENV, KEY)
    parser = argparse.ArgumentParser()
    serve_cmd.add_arguments(parser)
    assert parser.parse_args([]).api_key == KEY
    assert parser.parse_args(["--api-key", "other"]).api_key == "other"


def test_dashboard_in_chromium_with_the_key(server: RunningServer, tmp_path) -> None:
    from test_server_dashboard import chromium_args, ensure_chromium

    chromium = ensure_chromium()
    url = f"{server.base_url}/dashboard?api_key={KEY}"
    dom = subprocess.run(chromium_args(chromium, tmp_path / "with-key") + ["--dump-dom", url],
                         capture_output=True, text=True, timeout=90).stdout
    assert dom.count('data-id="') == server.stats().num_blocks, dom[-2000:]
    plain = subprocess.run(chromium_args(chromium, tmp_path / "fresh") + ["--dump-dom", f"{server.base_url}/dashboard"],
                           capture_output=True, text=True, timeout=90).stdout
    assert "invalid_api_key" in plain and 'data-id="' not in plain
