"""`pagedllm serve` with the fake engine, for the signal tests: python serve_fake.py [serve options]."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fake_serving_engine import FakeEngine  # noqa: E402

from pagedllm.entrypoints import cli, serve_cmd  # noqa: E402

serve_cmd.load_engine = lambda config: FakeEngine(config, step_delay=0.01)
sys.exit(cli.main(["serve", *sys.argv[1:]]))
