"""The thinking-budget side-by-side script's comparison of two engines' token ids, case by case."""

import json

from pagedllm.bench.peers.thinking_budget import main


def test_compare_counts_the_outputs_that_agree_in_each_case(tmp_path, capsys):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"budget 0": [[1, 2], [3]], "budget 3": [[4]]}))
    second.write_text(json.dumps({"budget 0": [[1, 2], [5]], "budget 3": [[4]]}))
    assert main(["compare", str(first), str(second)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "budget 0: 1 of 2 the same", "budget 3: 1 of 1 the same", "2 of 3 outputs the same"]
