import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """The doctor's tests run many tiny forwards; on a shared 2-core machine one thread is ~10x faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
