"""Fixtures of the batch tests on the kernels (test_batch_gpu.py, test_batch_tree_gpu.py,
test_batch_hybrid_gpu.py): one tiny noisy pair, an EAGLE-3 head for its target and a bigram target,
each built once per module that asks."""

from __future__ import annotations

import pytest

from tiny_models import bigram_target, build_pair, head_for


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("batch-kernels"), noisy=0.1)


@pytest.fixture(scope="module")
def head(pair, tmp_path_factory):
    return head_for(pair[0], tmp_path_factory.mktemp("batch-head") / "head")


@pytest.fixture(scope="module")
def bigram(pair, tmp_path_factory):
    return bigram_target(pair[0], tmp_path_factory.mktemp("batch-lookup") / "bigram")
