import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The doctor's tests run many tiny forwards; on a shared 2-core machine one thread is ~10x faster.
    Module-scoped and autouse, so it is in place before the modules' own fixtures build anything,
    and restored afterwards for other test folders."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
