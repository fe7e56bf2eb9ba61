"""``python -m rustccl.info``: prints ``rustccl.info()`` as JSON (the
package, and torch when installed, are imported first, as in a job)."""

from . import main

main()
