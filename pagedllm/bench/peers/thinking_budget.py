"""thinking_token_budget side by side: one engine's greedy token ids for chat prompts left inside a reasoning block,
under budgets and forced ends, written to a JSON file; `compare` says, case by case, whether two such files agree.

Runs under either virtualenv and imports only the engine it is asked for, so the same prompt ids go to both:

    .venv/bin/python pagedllm/bench/peers/thinking_budget.py pagedllm --model DIR --start Thinking --out p.json
    .venv-peers/bin/python pagedllm/bench/peers/thinking_budget.py vllm --model DIR --start Thinking --out v.json
    .venv/bin/python pagedllm/bench/peers/thinking_budget.py compare p.json v.json

The start string is the reasoning's opening tag (`reasoning_start_str`); the last prompt leaves no block open.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

QUESTIONS = ["What is 7 times 8?", "Name a prime number above 20.", "Why is the sky blue?"]
FORCED_ENDS = ("</think>", " Time is up.</think>")
BUDGETS = {"</think>": (None, 0, 3, 10), " Time is up.</think>": (0, 5)}
MAX_TOKENS = 40


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("engine", choices=["pagedllm", "vllm", "compare"])
    p.add_argument("files", nargs="*", help="compare: the two output files")
    p.add_argument("--model", help="Hugging Face directory (both engines read it)")
    p.add_argument("--start", default="<think>", help="the reasoning's opening tag")
    p.add_argument("--out", help="where the token ids go (JSON)")
    args = p.parse_args(argv)
    if args.engine == "compare":
        return _compare(*args.files)
    results = {}
    for end in FORCED_ENDS:
        generate, tokenizer = _engine(args.engine, args.model, args.start, end)
        prompts = _prompts(tokenizer, args.start)
        for budget in BUDGETS[end]:
            results[f"{end!r} budget {budget}"] = generate(prompts, budget)
    with open(args.out, "w") as f:
        json.dump(results, f)
    return 0


def _prompts(tokenizer: Any, start: str) -> list[list[int]]:
    texts = [f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{start}" for q in QUESTIONS]
    texts.append("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def _engine(name: str, model: str, start: str, end: str) -> tuple[Any, Any]:
    """A function (prompts, budget) -> each prompt's greedy output ids, and the engine's tokenizer."""
    if name == "vllm":
        from vllm import LLM, SamplingParams
        from vllm.config.reasoning import ReasoningConfig

        config: Any = ReasoningConfig(reasoning_start_str=start, reasoning_end_str=end)
        llm = LLM(model=model, dtype="float32", max_model_len=1024, reasoning_config=config)
        prompts_of = lambda ids: [{"prompt_token_ids": p} for p in ids]  # noqa: E731
    else:
        from pagedllm import LLM, SamplingParams

        config = {"reasoning_start_str": start, "reasoning_end_str": end}
        llm = LLM(model=model, dtype="float32", max_model_len=1024, reasoning_config=config)
        prompts_of = list

    def generate(prompts: list[list[int]], budget: int | None) -> list[list[int]]:
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, thinking_token_budget=budget, ignore_eos=True)
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts_of(prompts), params, use_tqdm=False)]

    return generate, llm.get_tokenizer()


def _compare(first: str, second: str) -> int:
    with open(first) as f, open(second) as g:
        a, b = json.load(f), json.load(g)
    same = 0
    for case, outputs in a.items():
        agree = [x == y for x, y in zip(outputs, b[case])]
        same += sum(agree)
        print(f"{case}: {sum(agree)} of {len(agree)} the same")
    print(f"{same} of {sum(map(len, a.values()))} outputs the same")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
