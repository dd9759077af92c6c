"""FullGraphStrategy refuses set-ups it cannot make exact, with messages that say why."""
from types import SimpleNamespace

import pytest

from lightning_fullgraph import FullGraphStrategy


def _trainer(datamodule, accumulate=1):
    return SimpleNamespace(datamodule=datamodule, accumulate_grad_batches=accumulate,
                           callbacks=[])


def test_data_must_come_from_the_fullgraph_datamodule():
    with pytest.raises(RuntimeError, match="needs its data from FullGraphDataModule"):
        FullGraphStrategy().setup(_trainer(None))


def test_partition_for_another_world_size_is_refused():
    partition = SimpleNamespace(num_parts=4)
    with pytest.raises(RuntimeError, match="partition has 4 parts but the world size is 1"):
        FullGraphStrategy().setup(_trainer(SimpleNamespace(partition=partition)))


def test_gradient_accumulation_is_refused():
    partition = SimpleNamespace(num_parts=1)
    with pytest.raises(ValueError, match="accumulate_grad_batches must be 1"):
        FullGraphStrategy().setup(_trainer(SimpleNamespace(partition=partition), 2))


def test_bad_loss_reduction():
    with pytest.raises(ValueError, match="loss_reduction must be 'mean' or 'sum'"):
        FullGraphStrategy(loss_reduction="max")


def test_bad_aggregation_names_the_choices():
    with pytest.raises(ValueError, match=r"aggregation must be one of \('post', 'pre', 'hybrid'\)"):
        FullGraphStrategy(aggregation="mixed")


def test_bad_huge_pages_setting_names_the_choices():
    with pytest.raises(ValueError, match="huge_pages must be None, True or False, got 'yes'"):
        FullGraphStrategy(huge_pages="yes")


def test_registered_under_a_name():
    from lightning.pytorch.strategies import StrategyRegistry
    assert "fullgraph" in StrategyRegistry and "fullgraph_spawn" in StrategyRegistry
