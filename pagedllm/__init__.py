"""pagedllm: a PagedAttention inference and serving engine in Python."""

from typing import Any

__version__ = "0.1.0"
__all__ = ["LLM", "BeamSearchParams", "RepetitionDetectionParams", "SamplingParams", "StructuredOutputsParams",
           "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy so that `import pagedllm.kv` never pulls in torch.
    if name == "LLM":
        from pagedllm.entrypoints.llm import LLM

        return LLM
    if name == "SamplingParams":
        from pagedllm.sampling_params import SamplingParams

        return SamplingParams
    if name == "BeamSearchParams":
        from pagedllm.entrypoints.beam_search import BeamSearchParams

        return BeamSearchParams
    if name == "RepetitionDetectionParams":
        from pagedllm.repetition_detection import RepetitionDetectionParams

        return RepetitionDetectionParams
    if name == "StructuredOutputsParams":
        from pagedllm.structured_outputs import StructuredOutputsParams

        return StructuredOutputsParams
    raise AttributeError(name)
