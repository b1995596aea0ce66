"""`specgen tune-kernels`' row counts (cli/tune.py `_rows`): the ones the profile's runs call the
target with, unless --rows says otherwise."""

import pytest

from specgen.cli.tune import _rows
from specgen.core.errors import UsageError
from specgen.core.profile import load_profile


def settings(**values):
    return load_profile("demo", {"speculation.k": 4, **values})


def test_a_chain_times_one_row_and_a_verification():
    assert _rows("", settings()) == (1, 5)


def test_a_tree_adds_its_rows_and_a_batch_its_rows_of_every_request():
    """A tree verifies its root and nodes; a batch B times what each request verifies (capped at the
    most rows one call takes)."""
    assert _rows("", settings(**{"speculation.tree_width": 4, "speculation.tree_nodes": 16})) == (1, 5, 17)
    assert _rows("", settings(**{"runtime.batch_size": 8})) == (1, 5, 40)
    assert _rows("", settings(**{"runtime.batch_size": 8, "speculation.tree_width": 4,
                                 "speculation.tree_nodes": 16})) == (1, 5, 17, 136)
    assert _rows("", settings(**{"runtime.batch_size": 256})) == (1, 5, 512)


def test_auto_shapes_add_no_rows():
    """tree_nodes and batch_size auto are chosen later, from measured facts: nothing to time yet."""
    assert _rows("", settings(**{"runtime.batch_size": "auto", "speculation.tree_width": 2,
                                 "speculation.tree_nodes": "auto"})) == (1, 5)


def test_rows_given_are_taken_and_checked():
    assert _rows("1,33,200", settings()) == (1, 33, 200)
    with pytest.raises(UsageError, match="from 1 to 512"):
        _rows("1,600", settings())
    with pytest.raises(UsageError, match="not a comma-separated list"):
        _rows("1,x", settings())
