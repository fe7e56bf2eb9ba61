# Experiment only: X_THP_DISABLE=1 turns transparent huge pages off for this process and its children (prctl PR_SET_THP_DISABLE).
import os
if os.environ.get("X_THP_DISABLE") == "1":
    import ctypes
    if ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_THP_DISABLE)")
