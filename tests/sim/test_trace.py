import json
import statistics

import pytest

from pagedllm.errors import InvalidInputError
from pagedllm.sim.trace import SyntheticConfig, TraceRequest, load_trace, save_trace, synthetic_trace


def _write(tmp_path, lines: list[str]):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_parses_required_and_optional_fields(tmp_path):
    path = _write(tmp_path, [
        '{"arrival": 0, "prompt_len": 10, "output_len": 5}',
        "",
        '{"arrival": 3, "prompt_len": 8, "output_len": 2, "prefix_group": "sys", "prefix_len": 4, '
        '"max_tokens": 9, "note": "ignored"}',
    ])
    a, b = load_trace(path)
    assert a == TraceRequest(0, 10, 5)
    assert b == TraceRequest(3, 8, 2, max_tokens=9, prefix_group="sys", prefix_len=4)


@pytest.mark.parametrize("line, problem", [
    ('{"arrival": 0, "prompt_len": 10', "bad JSON"),
    ('{"arrival": 0, "output_len": 5}', 'missing field "prompt_len"'),
    ('{"arrival": 0, "prompt_len": -3, "output_len": 5}', '"prompt_len" is negative'),
    ('{"arrival": -1, "prompt_len": 3, "output_len": 5}', '"arrival" is negative'),
    ('{"arrival": 0, "prompt_len": 3, "output_len": 0}', '"output_len" is too small'),
    ('{"arrival": 0, "prompt_len": "3", "output_len": 5}', '"prompt_len" must be an integer'),
    ('{"arrival": 0, "prompt_len": 3, "output_len": true}', '"output_len" must be an integer'),
    ('[1, 2]', "expected a JSON object"),
    ('{"arrival": 0, "prompt_len": 3, "output_len": 5, "prefix_len": 2}', "without"),
    ('{"arrival": 0, "prompt_len": 3, "output_len": 5, "prefix_group": 1, "prefix_len": 9}', "exceeds"),
    ('{"arrival": 0, "prompt_len": 3, "output_len": 5, "prefix_group": [1]}', "prefix_group"),
])
def test_malformed_line_names_file_line_and_problem(tmp_path, line, problem):
    path = _write(tmp_path, ['{"arrival": 0, "prompt_len": 1, "output_len": 1}', line])
    with pytest.raises(InvalidInputError) as err:
        load_trace(path)
    assert f"{path}:2:" in str(err.value) and problem in str(err.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(InvalidInputError, match="cannot read trace"):
        load_trace(tmp_path / "nope.jsonl")
    with pytest.raises(InvalidInputError, match="no requests"):
        load_trace(_write(tmp_path, [""]))


def test_save_and_load_round_trip(tmp_path):
    trace = synthetic_trace(SyntheticConfig(num_requests=50, seed=3))
    save_trace(trace, tmp_path / "s.jsonl")
    assert load_trace(tmp_path / "s.jsonl") == trace
    assert all(json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines())


def test_synthetic_is_seeded():
    cfg = SyntheticConfig(num_requests=200, seed=7)
    assert synthetic_trace(cfg) == synthetic_trace(SyntheticConfig(num_requests=200, seed=7))
    assert synthetic_trace(cfg) != synthetic_trace(SyntheticConfig(num_requests=200, seed=8))


def test_synthetic_bounds_and_means():
    cfg = SyntheticConfig(num_requests=20000, seed=1, rate=0.5, max_len=2048)
    trace = synthetic_trace(cfg)
    assert all(r.prompt_len >= 1 and r.output_len >= 1 for r in trace)
    assert all(r.prompt_len + r.output_len <= 2048 for r in trace)
    arrivals = [r.arrival for r in trace]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 0
    assert statistics.mean(r.prompt_len for r in trace) == pytest.approx(160, rel=0.06)
    assert statistics.mean(r.output_len for r in trace) == pytest.approx(340, rel=0.06)
    assert arrivals[-1] == pytest.approx(20000 / 0.5, rel=0.05)  # Poisson: mean gap 1 / rate
    # long-tailed: the median sits well below the mean
    assert statistics.median(r.prompt_len for r in trace) < 0.75 * 160
    shared = [r for r in trace if r.prefix_group is not None]
    assert len(shared) / len(trace) == pytest.approx(cfg.shared_fraction, abs=0.02)
    assert all(r.prefix_len == min(cfg.system_prompt_len, r.prompt_len) for r in shared)


def test_synthetic_clips_to_a_small_max_len():
    trace = synthetic_trace(SyntheticConfig(num_requests=2000, seed=2, max_len=64))
    assert max(r.prompt_len + r.output_len for r in trace) <= 64
    assert max(r.prompt_len for r in trace) <= 63


@pytest.mark.parametrize("kwargs", [dict(num_requests=0), dict(rate=0.0), dict(max_len=1),
                                    dict(shared_fraction=1.5)])
def test_synthetic_rejects_bad_config(kwargs):
    with pytest.raises(InvalidInputError):
        SyntheticConfig(**kwargs)


def test_a_trace_with_a_byte_order_mark_loads(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"arrival": 0, "prompt_len": 4, "output_len": 2}\n')
    (request,) = load_trace(path)
    assert (request.prompt_len, request.output_len) == (4, 2)


def test_max_tokens_zero_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival": 0, "prompt_len": 3, "output_len": 5, "max_tokens": 0}\n')
    with pytest.raises(InvalidInputError, match='"max_tokens" is too small'):
        load_trace(path)


def test_whitespace_only_lines_are_blank(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival": 0, "prompt_len": 3, "output_len": 5}\n   \n\t\n{"arrival": 1, "prompt_len": 2, "output_len": 1}\n')
    assert len(load_trace(path)) == 2


def test_a_zero_prefix_len_survives_a_round_trip(tmp_path):
    # prefix_len 0: the group shares no text; dropping it on save would make the whole prompt shared on load
    trace = [TraceRequest(0, 8, 2, max_tokens=4, prefix_group=0, prefix_len=0)]
    save_trace(trace, tmp_path / "s.jsonl")
    assert load_trace(tmp_path / "s.jsonl") == trace


def test_an_empty_prompt_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival": 0, "prompt_len": 0, "output_len": 5}\n')
    with pytest.raises(InvalidInputError, match=r't.jsonl:1: "prompt_len" is too small: 0 \(must be >= 1\)'):
        load_trace(path)
