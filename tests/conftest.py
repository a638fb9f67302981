import pytest

from engine import Engine
from engine.model_source import default_model_path


@pytest.fixture(scope="session")
def model_path():
    return default_model_path()


@pytest.fixture(scope="session")
def engine(model_path):
    """One shared engine for tests that leave it as they found it (every request finished)."""
    with Engine(model_path, n_ctx=4096, max_batch=32, step_token_budget=512) as eng:
        yield eng
