import json

import pytest

from pagedllm.entrypoints.cli import main

SMALL = ["simulate", "--synthetic", "40", "--seed", "1", "--pool-slots", "4096", "--max-len", "512",
         "--block-sizes", "4,16"]


def test_writes_json_plot_and_memory_map(tmp_path, capsys):
    out = {k: tmp_path / f"{k}.{ext}" for k, ext in (("json", "json"), ("plot", "png"), ("map", "png"),
                                                     ("trace", "jsonl"))}
    rc = main(SMALL + ["--json", str(out["json"]), "--plot", str(out["plot"]), "--draw", "60",
                       "--out", str(out["map"]), "--save-trace", str(out["trace"])])
    assert rc == 0
    table = capsys.readouterr().out
    assert "contig-max" in table and "prefix-16" in table
    report = json.loads(out["json"].read_text())
    assert set(report["policies"]) == {"contig-max", "contig-exact", "paged-4", "paged-16", "prefix-16"}
    assert report["policies"]["paged-16"]["finished"] == 40
    for key in ("plot", "map"):
        assert out[key].read_bytes()[:4] == b"\x89PNG"
    assert len(out["trace"].read_text().splitlines()) == 40


def test_draws_a_contiguous_policy_from_a_trace_file(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"arrival": {i}, "prompt_len": 30, "output_len": 40}}\n' for i in range(6)))
    png = tmp_path / "c.png"
    rc = main(["simulate", "--trace", str(trace), "--pool-slots", "1024", "--max-len", "256", "--block-sizes", "16",
               "--policies", "contig-exact,paged-16", "--draw", "5", "--out", str(png), "--draw-policy", "contig-exact"])
    assert rc == 0 and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("extra, message", [
    (["--block-sizes", "0"], "block size must be positive"),
    (["--block-sizes", "4,x"], "comma-separated integers"),
    (["--block-sizes", ""], "at least one integer"),
    (["--pool-slots", str(10**12)], "pool-slots must be at most"),
    (["--policies", " , "], "name at least one"),
    (["--trace", ""], "--trace needs a path"),
    (["--plot", "p.txt"], "name a .png file"),
    (["--json", "/no/such/folder/r.json"], "no folder /no/such/folder"),
    (["--draw-policy", "paged-99", "--draw", "3", "--out", "x.png"], "unknown draw policy"),
    (["--policies", "contig-pow2"], "unknown policy"),
    (["--draw", "3"], "go together"),
    (["--synthetic", "-5"], "must be positive"),
    (["--rate", "0"], "rate must be positive"),
])
def test_bad_options_give_one_line_errors(extra, message, capsys):
    args = SMALL[:1] + ["--pool-slots", "4096", "--max-len", "512"] + extra
    if "--synthetic" not in extra and "--trace" not in extra:
        args += ["--synthetic", "5"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith("pagedllm simulate: error:")


def test_malformed_trace_line_is_reported_with_its_line(tmp_path, capsys):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"arrival": 0, "prompt_len": 4, "output_len": 4}\n{"arrival": 1, "prompt_len": -4, "output_len": 4}\n')
    assert main(["simulate", "--trace", str(trace)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{trace}:2:" in err and "negative" in err and len(err.splitlines()) == 1
