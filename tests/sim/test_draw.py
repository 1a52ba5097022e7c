"""The memory map's picture: each request's tokens in its own colour exactly where its slots are."""

import numpy as np
import pytest

from pagedllm.sim.config import SimConfig
from pagedllm.sim.draw import _colour, _paint, _row_width, draw_memory_map
from pagedllm.sim.simulate import simulate
from pagedllm.sim.trace import TraceRequest


def memory_map(policy: str):
    trace = [TraceRequest(arrival=i, prompt_len=30, output_len=40) for i in range(6)]
    cfg = SimConfig(pool_slots=1024, max_len=256, block_sizes=(16,), prefix_block_size=None, contiguous=("exact",))
    return simulate(trace, cfg, policies=[policy], draw_step=5, draw_policy=policy).memory_map


def slots_of(img: np.ndarray, rgb) -> np.ndarray:
    return np.flatnonzero(np.isclose(img, np.array(rgb)).all(axis=1))


@pytest.mark.parametrize("policy", ["contig-exact", "paged-16"])
def test_each_request_is_painted_over_its_own_token_slots(policy):
    mm = memory_map(policy)
    block = mm.block_size
    assert len(mm.entries) == (4 if block is None else 6)  # four 256-slot runs fit 1024; paged holds all six
    img = _paint(mm, _row_width(mm.pool_slots, block))[0].reshape(-1, 3)  # one row per slot
    for i, entry in enumerate(mm.entries):
        if block is None:
            expected = np.arange(entry.start, entry.start + entry.used)
        else:  # logical position t lives in slot table[t // B] * B + t % B
            expected = np.array([entry.blocks[t // block] * block + t % block for t in range(entry.used)])
        assert slots_of(img, _colour(i)).tolist() == sorted(expected.tolist()), entry.label
    held = sum(e.capacity for e in mm.entries)
    assert len(slots_of(img, (1.0, 1.0, 1.0))) == mm.pool_slots - held  # the rest is free, white


def test_the_png_shows_every_requests_colour(tmp_path):
    from matplotlib.image import imread

    mm = memory_map("contig-exact")
    path = tmp_path / "map.png"
    draw_memory_map(mm, path)
    pixels = imread(path)[..., :3].reshape(-1, 3)
    for i in range(len(mm.entries)):
        assert (np.abs(pixels - np.array(_colour(i))) < 1.5 / 255).all(axis=1).sum() > 100, f"request {i} not drawn"


def test_cells_past_the_end_of_the_pool_are_not_painted_free():
    from pagedllm.sim.draw import BEYOND_RGB

    trace = [TraceRequest(arrival=0, prompt_len=30, output_len=40)]
    cfg = SimConfig(pool_slots=1000, max_len=256, block_sizes=(8,), prefix_block_size=None)
    mm = simulate(trace, cfg, policies=["paged-8"], draw_step=5, draw_policy="paged-8").memory_map
    img = _paint(mm, _row_width(mm.pool_slots, 8))[0].reshape(-1, 3)
    assert len(img) > mm.pool_slots  # the last row runs past the pool
    assert slots_of(img, BEYOND_RGB).tolist() == list(range(mm.pool_slots, len(img)))
    assert len(slots_of(img, (1.0, 1.0, 1.0))) == mm.pool_slots - mm.entries[0].capacity
