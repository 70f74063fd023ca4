import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(max(1, os.cpu_count() or 1))


@pytest.fixture(autouse=True, scope="session")
def _fresh_results(tmp_path_factory):
    """Chapters and sweeps write to a fresh results folder, so no test passes from a cache."""
    os.environ["GA_RESULTS"] = str(tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="session")
def smol():
    import helpers

    return helpers.load("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def ids(smol):
    """A short KV prompt, tokenised for SmolLM2."""
    prompt = "Memorize the following dictionary:\nriver:42\nlamp:7\nriver:"
    return smol.tokenizer(prompt, return_tensors="pt").input_ids
