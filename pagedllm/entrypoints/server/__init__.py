"""The OpenAI-compatible HTTP server, one concern per module (see docs/server.md).

The request body cap's default lives here, free of the server's packages, so that the `pagedllm` command
builds its `serve` arguments on a machine without fastapi (the GPU machine of scripts/gpu_check.sh).
"""

DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20
