"""Workload generators: seeded, lengths within bounds, fitted to the model length; JSONL requests."""

import json

import pytest

from pagedllm.bench.workloads import WORKLOADS, WorkloadSpec, build_workload, load_jsonl, save_jsonl
from pagedllm.errors import InvalidInputError

VOCAB = 1000


def build(name, count=None, seed=0, max_len=2048):
    return build_workload(WorkloadSpec(name, count, seed, VOCAB, max_len))


@pytest.mark.parametrize("name", WORKLOADS)
def test_same_seed_same_requests_other_seed_differs(name):
    a, b, c = build(name, 6, seed=1), build(name, 6, seed=1), build(name, 6, seed=2)
    assert [(r.prompt, r.output_len, r.n) for r in a.requests] == [(r.prompt, r.output_len, r.n) for r in b.requests]
    assert [r.prompt for r in a.requests] != [r.prompt for r in c.requests]
    assert all(16 <= t < VOCAB for r in a.requests for t in r.prompt)


def test_mixed_lengths_within_bounds():
    w = build("mixed", 200)
    assert len(w.requests) == 200
    assert all(16 <= len(r.prompt) <= 512 and 16 <= r.output_len <= 128 and r.n == 1 for r in w.requests)
    assert min(len(r.prompt) for r in w.requests) < 100 and max(len(r.prompt) for r in w.requests) > 400


def test_shared_prefix_shares_exactly_the_prefix():
    w = build("shared-prefix", 10)
    prefix = w.requests[0].prompt[:384]
    for r in w.requests:
        assert r.prompt[:384] == prefix and 16 <= len(r.prompt) - 384 <= 64 and r.output_len == 64
    assert len({tuple(r.prompt[384:]) for r in w.requests}) == 10


def test_parallel_sampling_and_beam_shapes():
    ps, beam = build("parallel-sampling"), build("beam")
    assert len(ps.requests) == 8 and all(len(r.prompt) == 256 and r.n == 4 and not r.beam for r in ps.requests)
    assert ps.requests[0].num_output_tokens == 4 * 64
    assert all(r.beam and r.n == 4 for r in beam.requests) and beam.requests[0].num_output_tokens == 64


def test_sharegpt_like_fits_the_model_length():
    w = build("sharegpt-like", 300, max_len=512)
    assert all(len(r.prompt) + r.output_len <= 512 and len(r.prompt) >= 1 for r in w.requests)
    assert len({len(r.prompt) for r in w.requests}) > 50  # a spread, not a constant


def test_synthetic_requests_are_clipped_to_a_short_model():
    w = build("mixed", 50, max_len=200)
    assert all(len(r.prompt) + r.output_len <= 200 and r.output_len <= 100 for r in w.requests)


def test_length_stats():
    stats = build("parallel-sampling", 3).length_stats()
    assert stats["num_requests"] == 3 and stats["prompt_tokens"] == 768 and stats["output_tokens"] == 3 * 4 * 64
    assert stats["prompt_len"] == {"min": 256, "mean": 256.0, "max": 256} and stats["n"] == [4]


def test_jsonl_round_trip_and_text_prompts(tmp_path):
    path = tmp_path / "w.jsonl"
    save_jsonl(build("mixed", 4), path)
    with open(path, "a") as f:
        f.write("\n" + json.dumps({"prompt": "hello there", "max_tokens": 8, "n": 2}) + "\n")
    w = load_jsonl(path, 2048)
    assert [r.prompt for r in w.requests[:4]] == [r.prompt for r in build("mixed", 4).requests]
    assert (w.requests[4].prompt, w.requests[4].output_len, w.requests[4].n) == ("hello there", 8, 2)


@pytest.mark.parametrize("line, message", [
    ("{bad", "bad JSON"),
    ('{"prompt": ""}', "prompt"),
    ('{"prompt": [1, 2], "max_tokens": 0}', "max_tokens"),
    ('{"prompt": "x", "n": true}', '"n"'),
    ('{"prompt": "x", "beam": "no"}', '"beam" must be true or false'),
])  # fmt: skip
def test_jsonl_errors_name_the_line(tmp_path, line, message):
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(InvalidInputError, match=rf"w.jsonl:2: .*{message}"):
        load_jsonl(path, 2048)


def test_unknown_workload_and_too_long_jsonl(tmp_path):
    with pytest.raises(InvalidInputError, match="unknown workload"):
        build("nope")
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"prompt": list(range(20, 120)), "max_tokens": 50}) + "\n")
    with pytest.raises(InvalidInputError, match="does not fit"):
        load_jsonl(path, 128)


@pytest.mark.parametrize("count", [0, -3])
def test_a_count_of_no_requests_is_refused(count):
    with pytest.raises(InvalidInputError, match="num-requests"):
        build_workload(WorkloadSpec("mixed", count))


def test_a_negative_prefix_length_is_refused():
    with pytest.raises(InvalidInputError, match="prefix-len"):
        build_workload(WorkloadSpec("shared-prefix", 4, prefix_len=-5))


def test_a_workload_that_is_not_utf8_is_refused(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_bytes(b'{"prompt": "\xff\xfe"}\n')
    with pytest.raises(InvalidInputError, match="not UTF-8"):
        load_jsonl(path, 2048)


def test_a_byte_order_mark_is_not_an_error(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": [5, 6, 7], "max_tokens": 2}\n')
    assert load_jsonl(path, 2048).requests[0].prompt == [5, 6, 7]
