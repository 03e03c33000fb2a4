"""`python -m llmfleet.workers.serve -- <vLLM args>`: one serving replica with graceful drain."""

import sys

from llmfleet.workers.serve.worker import main

sys.exit(main())
