"""Unsupported input raises a RuntimeError naming rustccl, the collective
and the reason, and the group keeps working; the torch-free numpy API."""

import tempfile

import launch


def _ok(results):
    failures = [f for _, fs in results for f in fs]
    assert sum(n for n, _ in results) > 0
    assert not failures, "\n".join(failures[:40])


def test_unsupported_input_errors():
    _ok(launch.run("w_misc:errors", 2))


def test_numpy_communicator():
    _ok(launch.run("w_misc:numpy_api", 3, tempfile.mkdtemp(prefix="rustccl-np-"), init="none"))
