"""`python -m paged.serve ...`: the same as `paged serve ...` (the OpenAI-compatible server)."""
import sys

from .server import main

sys.exit(main())
