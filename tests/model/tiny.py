"""Tiny random-weight HF models for tests: write one with transformers, keep the oracle next to it."""

from pathlib import Path
from typing import Any

import torch

TINY_VOCAB = 384
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = [
    "PagedAttention stores the KV cache in fixed-size blocks of one preallocated pool.",
    "Each sequence owns a block table that maps its logical blocks to physical ones.",
    "The quick brown fox jumps over the lazy dog. Hello, world! 0123456789",
    "Continuous batching mixes prefill chunks and decode tokens in one step.",
]


def tiny_config_kwargs(**overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        initializer_range=0.15,  # peaked logits, so greedy ties (float noise) are unlikely
    )
    kwargs.update(overrides)
    return kwargs


def make_hf_model(model_type: str = "llama", seed: int = 0, **overrides: Any) -> Any:
    """A random-weight transformers model (float32, eval) of the given family."""
    import transformers

    config_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                  "mistral": transformers.MistralConfig, "qwen3": transformers.Qwen3Config}[model_type]  # fmt: skip
    model_cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
                 "mistral": transformers.MistralForCausalLM,
                 "qwen3": transformers.Qwen3ForCausalLM}[model_type]  # fmt: skip
    torch.manual_seed(seed)
    config = config_cls(**tiny_config_kwargs(**overrides))
    model = model_cls(config).eval()
    with torch.no_grad():  # transformers starts biases at 0 and norms at 1: a loader that dropped them would pass
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.5)
            elif "norm" in name:
                param.normal_(1.0, 0.2)
    return model


def make_tiny_tokenizer() -> Any:
    """A byte-level BPE tokenizer trained offline on a few sentences, with ChatML specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<unk>"
    )
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def save_tiny_dir(path: Path, model_type: str = "llama", seed: int = 0, **overrides: Any) -> Path:
    model = make_hf_model(model_type, seed, **overrides)
    model.save_pretrained(path)
    make_tiny_tokenizer().save_pretrained(path)
    return path
