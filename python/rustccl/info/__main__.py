"""``python -m rustccl.info``: a short summary of what rustccl sees, or
everything as JSON with ``--json`` (the package, and torch when installed,
are imported first, as in a job)."""

from . import main

main()
