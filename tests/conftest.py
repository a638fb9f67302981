import os

# Before `engine` is imported: every test runs with the engine checking its own rules (which
# thread writes what, the KV cache's invariants after every step: engine/debug.py), and so do
# the servers tests start, which inherit the environment.
os.environ.setdefault("COBATCH_DEBUG_CHECKS", "1")

import pytest

from engine import Engine
from engine.model_source import default_model_path


def pytest_configure(config):
    # `-m "not model"` is the fast selection: a test that loads the model there is missing its
    # marker, and says so instead of quietly making the selection slow.
    if "not model" in (config.option.markexpr or ""):
        from bindings import model

        def refuse(self, *args, **kwargs):
            raise RuntimeError("this test loads the model: mark it with pytest.mark.model")

        model.Model.__init__ = refuse


@pytest.fixture(scope="session")
def model_path():
    return default_model_path()


@pytest.fixture(scope="session")
def engine(model_path):
    """One shared engine for tests that leave it as they found it (every request finished).

    Its prefix cache is off: cached cells change where llama.cpp places new tokens, and its sums
    then round differently, so golden and same-seed tests would depend on which tests ran
    before. The prefix cache has its own tests (test_prefix_cache.py, test_kv_cache_memory.py).
    So is speculative decoding, for the same reason: draft rows change a step's shape, and
    earlier tests' outputs propose drafts (test_speculation_model.py tests it).
    """
    with Engine(model_path, n_ctx=4096, max_running=32, step_token_budget=512, prefix_cache=False,
                speculative=False) as eng:
        yield eng


@pytest.fixture(scope="session")
def live():
    """A real uvicorn server on 127.0.0.1 over the shared small server engine."""
    from tests.server_fixtures import running_server, shared_engine

    engine = shared_engine()
    with running_server(lambda: engine, engine) as server:
        yield server


@pytest.fixture
def http(live):
    import httpx

    from tests.server_fixtures import assert_engine_idle

    with httpx.Client(base_url=live.url, timeout=60) as c:
        yield c
    assert_engine_idle(live.engine)


@pytest.fixture
def openai_client(live):
    import openai

    from tests.server_fixtures import assert_engine_idle

    c = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=60)
    yield c
    c.close()
    assert_engine_idle(live.engine)


@pytest.fixture(autouse=True)
def no_object_written_by_a_thread_that_does_not_own_it():
    """Fails the test during which any engine object was written from the wrong thread, even
    where the engine caught the WrongThreadError and failed only a request."""
    from engine import ownership

    seen = len(ownership.violations)
    yield
    assert ownership.violations[seen:] == []
