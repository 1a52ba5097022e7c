"""The memory simulator: replay a request trace through the `pagedllm.kv` allocators (no model), measure and draw."""
