"""init_process_group with env://, tcp:// and file:// for 1-4 ranks; several
groups alive at once; init / destroy cycles in one process."""

import pytest

import launch


# env:// with every world size; tcp:// and file:// with 2 and 4 ranks.
CASES = [("env", 1), ("env", 2), ("env", 3), ("env", 4), ("tcp", 2), ("tcp", 4), ("file", 2), ("file", 4)]


@pytest.mark.parametrize("init,world", CASES)
def test_init_methods(init, world):
    launch.expect_ok(launch.run("w_misc:basic", world, init=init))


@pytest.mark.parametrize("world", [3, 4])
def test_several_groups_alive(world):
    launch.expect_ok(launch.run("w_misc:groups", world))


def test_init_destroy_cycles():
    launch.expect_ok(launch.run("w_misc:reinit", 2, 5, init="none"))
