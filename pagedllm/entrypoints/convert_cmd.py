"""`pagedllm convert --to-hf DIR [--model PATH]`: a GGUF (default: the built-in model) as an HF directory."""

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--to-hf", metavar="DIR", required=True, help="output Hugging Face directory")
    parser.add_argument("--model", metavar="PATH", help="GGUF file or HF directory (default: the built-in model)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="weight dtype on disk (default float32: the exact dequantized values)")  # fmt: skip
    parser.add_argument("--force", action="store_true", help="overwrite an existing model in DIR")
    parser.epilog = "The output loads in transformers (AutoModelForCausalLM.from_pretrained(DIR)) and vLLM."


def run(args: argparse.Namespace) -> int:
    import torch

    from pagedllm.errors import InvalidInputError
    from pagedllm.model.default_model import require_default_model
    from pagedllm.model.hf_writer import save_hf_dir
    from pagedllm.model.loader import load_model
    from pagedllm.model.tokenizer import load_tokenizer

    if not args.to_hf.strip() or args.model is not None and not args.model.strip():
        raise InvalidInputError("--to-hf and --model need a path, not an empty string")
    out = Path(args.to_hf).expanduser()
    if (out / "config.json").exists() and not args.force:
        raise InvalidInputError(f"{out} already holds a model (config.json); pass --force to overwrite")
    source = Path(args.model).expanduser() if args.model else require_default_model()
    model, config = load_model(source, getattr(torch, args.dtype))
    files = save_hf_dir(model, config, out, load_tokenizer(source))
    print(f"wrote {len(files)} files to {out}: {', '.join(p.name for p in files)}")
    return 0
