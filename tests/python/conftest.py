"""Shared pytest hooks for the Python tests."""

import os

import pytest

# A table the tuner cached on this machine (~/.cache/rustccl/tune) would
# change the algorithms the tests take; test_tune.py turns it back on.
os.environ.setdefault("RUSTCCL_TUNE", "off")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    # Each phase's report on the test item (item.rep_setup, item.rep_call),
    # for fixtures that check something after a test that ran.
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep
