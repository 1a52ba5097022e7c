"""`pagedllm generate "PROMPT"`: stream one answer to the terminal."""

import argparse
import sys

from pagedllm.entrypoints.engine_args import add_engine_arguments, engine_config_from_args
from pagedllm.errors import InvalidInputError
from pagedllm.model.chat_template import load_chat_template


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the prompt (with --chat: the user message)")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    parser.add_argument("--system", default=None,
                        help="system message (with --chat; an empty one replaces a template's default)")
    parser.add_argument("--chat-template", default=None,
                        help="with --chat: this template in place of the model's (a Jinja file, or the template "
                             "itself), as `pagedllm serve --chat-template` takes it")
    s = parser.add_argument_group("sampling")
    s.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate")
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--top-k", type=int, default=0, help="0 = off")
    s.add_argument("--min-p", type=float, default=0.0)
    s.add_argument("--repetition-penalty", type=float, default=1.0)
    s.add_argument("--sample-seed", type=int, default=None, help="seed of this request's sampling")
    s.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    s.add_argument("--thinking-token-budget", type=int, default=None,
                   help="end a reasoning block after this many tokens (needs --reasoning-parser or --reasoning-config)")
    s.add_argument("--stats", action="store_true", help="print KV and timing statistics after the answer")
    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import logging

    from pagedllm.engine.llm_engine import LLMEngine
    from pagedllm.sampling_params import SamplingParams

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    for flag, value in (("--system", args.system), ("--chat-template", args.chat_template)):
        if value is not None and not args.chat:
            raise InvalidInputError(f"{flag} needs --chat (it is for the chat template)")
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        thinking_token_budget=args.thinking_token_budget,
        seed=args.sample_seed,
        stop=args.stop,
    )
    template = None if args.chat_template is None else load_chat_template(args.chat_template)  # before the model
    engine = LLMEngine(engine_config_from_args(args))
    try:
        engine.add_request("cli", _prompt(engine, args, template), params)
        output = _stream(engine)
        if args.stats:
            _print_stats(engine, output)
    finally:
        engine.shutdown()  # tensor-parallel workers stop now, not at exit
    return 0


def _prompt(engine, args: argparse.Namespace, template: str | None = None) -> str | list[int]:
    """The request's prompt; with --chat, through `template` (--chat-template's text) or the model's own."""
    if not args.chat:
        return args.prompt
    messages = [{"role": "system", "content": args.system}] if args.system is not None else []
    messages.append({"role": "user", "content": args.prompt})
    return engine.apply_chat_template(messages, chat_template=template)[1]


def _stream(engine):
    output = None
    while engine.has_unfinished_requests():
        for output in engine.step():
            sys.stdout.write(output.outputs[0].new_text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    return output


def _print_stats(engine, output) -> None:
    m = output.metrics
    n = len(output.outputs[0].token_ids)
    ttft = m.first_token_time - m.arrival_time
    decode = (m.finished_time - m.first_token_time) / max(n - 1, 1)
    print(f"[{n} tokens, time to first token {ttft:.2f}s, {1 / decode:.1f} tokens/s after it]", file=sys.stderr)
    print(f"[{engine.stats()}]", file=sys.stderr)
