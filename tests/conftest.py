import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# pytest-xdist's lanes share the cores, and so do the chapters' kernels each lane starts.
_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
_threads = max(1, _cores // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(_threads)
torch.set_num_threads(_threads)


def pytest_addoption(parser):
    parser.addoption(
        "--slow",
        action="store_true",
        help="property tests (tests/test_properties.py) draw many more examples",
    )


def pytest_configure(config):
    # Hypothesis fixes a test's settings when the test is decorated, at import: test_properties
    # reads the choice from the environment, which is set here, before collection.
    if config.getoption("--slow"):
        os.environ["GA_SLOW_TESTS"] = "1"


# The longest files first, so that each lane starts on one of them and the short files fill in
# behind (pytest-xdist's --dist loadfile hands out files in collection order with
# --no-loadscope-reorder, pyproject's addopts; by default it orders them by their number of tests).
# Measured in two lanes: the smoke book 7.5 min, the rehearsal 7.8, the zoo's checkpoints 9, the
# engine 3, the models 2.
LONGEST_FIRST = (
    "tests/test_book.py",
    "tests/test_book_rehearsal.py",
    "tests/test_zoo.py",
    "tests/test_engine.py",
    "tests/test_models.py",
)


def pytest_collection_modifyitems(config, items):
    place = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: place.get(item.nodeid.split("::")[0], len(LONGEST_FIRST)))  # stable


@pytest.fixture(autouse=True, scope="session")
def _fresh_results(tmp_path_factory):
    """Chapters and sweeps write to a fresh results folder, so no test passes from a cache."""
    os.environ["GA_RESULTS"] = str(tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="session")
def smol():
    """SmolLM2 in float32 (not bfloat16, where the CPU computes it natively): the tests that compare two computations of
    the same numbers (the engine against the scorer, a hook against a plain run) check them to
    2e-4, which bfloat16's rounding does not meet (they differ by up to 0.32 nats there)."""
    import helpers

    return helpers.load("smollm2-135m-instruct", dtype=torch.float32)


@pytest.fixture(scope="session")
def ids(smol):
    """A short KV prompt, tokenised for SmolLM2."""
    prompt = "Memorize the following dictionary:\nriver:42\nlamp:7\nriver:"
    return smol.tokenizer(prompt, return_tensors="pt").input_ids
