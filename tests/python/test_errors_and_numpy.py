"""Unsupported input raises a RuntimeError naming rustccl, the collective
and the reason, and the group keeps working; the torch-free numpy API."""

import tempfile

import launch


def test_unsupported_input_errors():
    launch.expect_ok(launch.run("w_misc:errors", 2))


def test_numpy_communicator():
    launch.expect_ok(launch.run("w_misc:numpy_api", 3, tempfile.mkdtemp(prefix="rustccl-np-"), init="none"))
