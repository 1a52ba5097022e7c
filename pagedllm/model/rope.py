"""Rotary frequency scaling: the kinds a model config may name, and the inverse frequencies and cos/sin scale each
gives, computed as transformers (config.json) and llama.cpp (GGUF) compute them.

- `Llama3Rope`: Llama 3.1+; long wavelengths divided by `factor`, short ones kept, the band between blended.
- `LinearRope`: position interpolation; every frequency divided by `factor`.
- `YarnRope`: YaRN; a ramp between interpolated and original frequencies, and cos/sin scaled by `attention_factor`.
- `FrequencyFactorsRope`: a GGUF's `rope_freqs` tensor, one divisor per frequency (how llama.cpp stores Llama 3.1+'s
  scaling).
"""

import math
from dataclasses import dataclass
from typing import Any

import torch

from pagedllm.errors import ModelLoadError


@dataclass(slots=True, frozen=True)
class Llama3Rope:
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if (self.factor <= 0 or self.low_freq_factor <= 0 or self.high_freq_factor <= self.low_freq_factor
                or self.original_max_position_embeddings <= 0):
            raise ModelLoadError(f"invalid llama3 rope scaling {self}")

    def scale(self, inv_freq: torch.Tensor, theta: float) -> torch.Tensor:
        wavelen = 2 * math.pi / inv_freq
        original = self.original_max_position_embeddings
        smooth = (original / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        blended = (1 - smooth) * inv_freq / self.factor + smooth * inv_freq
        scaled = torch.where(wavelen > original / self.low_freq_factor, inv_freq / self.factor, blended)
        return torch.where(wavelen < original / self.high_freq_factor, inv_freq, scaled)

    def hf_parameters(self, theta: float) -> dict[str, Any]:
        return {"rope_type": "llama3", "factor": self.factor, "low_freq_factor": self.low_freq_factor,
                "high_freq_factor": self.high_freq_factor,
                "original_max_position_embeddings": self.original_max_position_embeddings}  # fmt: skip


@dataclass(slots=True, frozen=True)
class LinearRope:
    factor: float

    def __post_init__(self) -> None:
        if not self.factor >= 1:
            raise ModelLoadError(f"linear rope scaling needs a factor of at least 1, got {self.factor}")

    def scale(self, inv_freq: torch.Tensor, theta: float) -> torch.Tensor:
        return inv_freq / self.factor

    def hf_parameters(self, theta: float) -> dict[str, Any]:
        return {"rope_type": "linear", "factor": self.factor}


@dataclass(slots=True, frozen=True)
class YarnRope:
    factor: float
    original_max_position_embeddings: int
    attention_factor: float
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True  # the ramp's ends rounded outwards to whole dimensions

    def __post_init__(self) -> None:
        if (not self.factor > 0 or self.original_max_position_embeddings <= 0 or not self.attention_factor > 0
                or not self.beta_fast > 0 or not self.beta_slow > 0):
            raise ModelLoadError(f"invalid yarn rope scaling {self}")

    def scale(self, inv_freq: torch.Tensor, theta: float) -> torch.Tensor:
        dim = 2 * len(inv_freq)
        low, high = self._ramp_ends(dim, theta)
        span = high - low if high != low else 0.001  # as transformers keeps the ramp defined
        ramp = ((torch.arange(dim // 2, dtype=torch.float32, device=inv_freq.device) - low) / span).clamp(0, 1)
        keep = 1 - ramp  # how much of each original frequency stays (the fast ones: all of it)
        return inv_freq / self.factor * (1 - keep) + inv_freq * keep

    def _ramp_ends(self, dim: int, theta: float) -> tuple[float, float]:
        """The dimensions where `beta_fast` and `beta_slow` rotations fit in the original context."""
        def dimension(rotations: float) -> float:
            wavelengths = self.original_max_position_embeddings / (rotations * 2 * math.pi)
            return dim * math.log(wavelengths) / (2 * math.log(theta))

        low, high = dimension(self.beta_fast), dimension(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        return max(low, 0), min(high, dim - 1)

    def hf_parameters(self, theta: float) -> dict[str, Any]:
        return {"rope_type": "yarn", "factor": self.factor,
                "original_max_position_embeddings": self.original_max_position_embeddings,
                "attention_factor": self.attention_factor, "beta_fast": self.beta_fast, "beta_slow": self.beta_slow,
                "truncate": self.truncate}  # fmt: skip


@dataclass(slots=True, frozen=True)
class FrequencyFactorsRope:
    factors: tuple[float, ...]

    def __post_init__(self) -> None:
        if not all(f > 0 and math.isfinite(f) for f in self.factors):
            raise ModelLoadError("rope_freqs: every frequency factor must be a positive finite number")

    def scale(self, inv_freq: torch.Tensor, theta: float) -> torch.Tensor:
        return inv_freq / torch.tensor(self.factors, dtype=torch.float32, device=inv_freq.device)

    def hf_parameters(self, theta: float) -> dict[str, Any]:
        """config.json has no per-frequency factors: the llama3 scaling that gives these ones, or an error."""
        return llama3_from_factors(self.factors, theta).hf_parameters(theta)


RopeScaling = Llama3Rope | LinearRope | YarnRope | FrequencyFactorsRope


def rope_inv_freq(theta: float, head_dim: int, scaling: RopeScaling | None) -> torch.Tensor:
    """[head_dim / 2] float32 inverse frequencies, scaled as `scaling` says."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    return inv_freq if scaling is None else scaling.scale(inv_freq, theta)


def rope_attention_factor(scaling: RopeScaling | None) -> float:
    """What cos and sin are multiplied by (YaRN's attention scaling; 1 otherwise)."""
    return scaling.attention_factor if isinstance(scaling, YarnRope) else 1.0


def yarn_attention_factor(factor: float, mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    """YaRN's default cos/sin scale: 0.1 ln(factor) + 1, or DeepSeek's ratio of two such scales."""
    def scale(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    return scale(mscale) / scale(mscale_all_dim) if mscale and mscale_all_dim else scale(1.0)


def llama3_from_factors(factors: tuple[float, ...], theta: float) -> Llama3Rope:
    """The llama3 scaling whose frequency divisors are `factors` (as llama.cpp's converter computed them from it).

    Only the ratios of its three lengths show in the divisors, so low_freq_factor is taken as 1 (Llama 3.1's own
    value); the blended band must hold at least two frequencies to give the other two."""
    inv_freq = rope_inv_freq(theta, 2 * len(factors), None).double()
    f = torch.tensor(factors, dtype=torch.float64)
    factor = float(f.max())
    # divisor 1 / ((1 - s) / factor + s) in the band, with s = (original / wavelength - 1) / (high - 1)
    s = (1 / f - 1 / factor) / (1 - 1 / factor) if factor > 1 else torch.zeros_like(f)
    band = (s > 1e-6) & (s < 1 - 1e-6)
    if int(band.sum()) < 2:
        raise ModelLoadError("rope_freqs: these frequency factors do not give a llama3 rope scaling that config.json "
                             "can hold (fewer than two frequencies in its blended band)")
    slope, intercept = _line(inv_freq[band] / (2 * math.pi), s[band])
    not_llama3 = ModelLoadError("rope_freqs: these frequency factors are not a llama3 rope scaling, which config.json "
                                "would need")
    if not intercept < 0:  # -1 / (high - 1)
        raise not_llama3
    high = 1 - 1 / intercept
    original = round(slope * (high - 1))
    if original <= 0:
        raise not_llama3
    scaling = Llama3Rope(round(factor, 3), 1.0, round(high, 3), original)
    if not torch.allclose(scaling.scale(inv_freq.float(), theta), inv_freq.float() / f.float(), rtol=1e-4):
        raise not_llama3
    return scaling


def _line(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Least-squares slope and intercept of y over x."""
    x_mean, y_mean = x.mean(), y.mean()
    slope = ((x - x_mean) * (y - y_mean)).sum() / ((x - x_mean) ** 2).sum()
    return float(slope), float(y_mean - slope * x_mean)
