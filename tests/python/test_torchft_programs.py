"""torchft's own programs on rustccl's process group: its integration tests,
run from the installed torchft package with its gloo process group replaced
by rustccl's (the Manager's DDP, healthy, after an injected failure and with
several ranks per replica; its allreduce; LocalSGD and DiLoCo), and its
collective checks on every op. Replicas run as threads of this process, so
every test also runs several rustccl groups, for different ranks, in one
process."""

from __future__ import annotations

from datetime import timedelta

import pytest

pytest.importorskip("torchft")
pytest.importorskip("parameterized")

import torchft._test.diloco_trainer as dt  # noqa: E402
import torchft.local_sgd_integ_test as lsit  # noqa: E402
import torchft.manager_integ_test as mit  # noqa: E402
import torchft.process_group_test as pgt  # noqa: E402
from parameterized import parameterized  # noqa: E402

from rustccl.torchft import ProcessGroupRustccl  # noqa: E402


class _Counted(ProcessGroupRustccl):
    """rustccl's process group, counting the groups it builds."""

    built = 0

    def _create_pg(self, store, rank, world_size):
        type(self).built += 1
        return super()._create_pg(store, rank, world_size)


# torchft programs that never get as far as configuring a process group
_CONFIGURE_NONE = {"test_quorum_timeout"}


@pytest.fixture
def rustccl_for_gloo(monkeypatch, request):
    for module in (mit, lsit, dt):
        monkeypatch.setattr(module, "ProcessGroupGloo", _Counted)
    _Counted.built = 0
    yield
    # the programs ran over rustccl, not over a process group of their own
    ran = getattr(request.node, "rep_call", None)
    if ran is not None and ran.passed and request.node.originalname not in _CONFIGURE_NONE:
        assert _Counted.built > 0, "no rustccl group was configured"


@pytest.mark.usefixtures("rustccl_for_gloo")
class TestManagerOnRustccl(mit.ManagerIntegTest):
    # torchcomms' process group in place of gloo's: not a gloo program
    test_ddp_healthy_torchcomms = None
    test_ddp_recovery_torchcomms = None


@pytest.mark.usefixtures("rustccl_for_gloo")
class TestLocalSGDOnRustccl(lsit.LocalSGDIntegTest):
    pass


class TestCollectivesOnRustccl(pgt.MultiPgBaseTest):
    """torchft's checks of every op (gloo's skip all_to_all and
    reduce_scatter) on 3 ranks of one group."""

    WORLD_SIZE = 3

    @classmethod
    def _create_pg(cls, backend):
        return ProcessGroupRustccl(timeout=timedelta(seconds=10))

    @parameterized.expand(pgt._ALL_COLLECTIVES)
    def test_collective(self, collective: str) -> None:
        self._run_parallel(collective, device="cpu")
