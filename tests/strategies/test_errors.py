"""FullGraphStrategy refuses set-ups it cannot make exact, with messages that say why."""
from types import SimpleNamespace

import pytest

from lightning_fullgraph import FullGraphStrategy, KernelConfig
from lightning_fullgraph.engine import ExchangeConfig


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
    with pytest.raises(ValueError, match=r"choose one of \('post', 'pre', 'hybrid', 'auto'\)"):
        FullGraphStrategy(exchange=ExchangeConfig(aggregation="mixed"))


def test_bad_huge_pages_setting_names_the_choices():
    with pytest.raises(ValueError, match="huge_pages must be None, True or False, got 'yes'"):
        FullGraphStrategy(kernels=KernelConfig(huge_pages="yes"))


def test_registered_under_a_name():
    from lightning.pytorch.strategies import StrategyRegistry
    assert "fullgraph" in StrategyRegistry and "fullgraph_spawn" in StrategyRegistry


@pytest.mark.parametrize("given,top,expected", [
    # num_classes inferred: the model is narrower than the labels.
    (None, 6, "the graph's labels reach 6, so the model needs 7 outputs: size the model's "
              "output layer with datamodule.num_classes (7)"),
    # num_classes given too small and not checked (validate=False): the fix names both ways.
    (3, 6, "the graph's labels reach 6, so the model needs 7 outputs, but num_classes was given "
           "as 3 and not checked (validate=False): pass num_classes=7 (--num-classes 7)"),
    # num_classes given larger than the labels: the model is narrower than num_classes.
    (10, 6, "the graph's labels reach 6, so the model needs 7 outputs: size the model's output "
            "layer with datamodule.num_classes (10)"),
])
def test_an_out_of_range_target_is_explained_from_the_labels_true_maximum(given, top, expected):
    # The note used to print num_classes - 1 as the labels' maximum ("labels reach 2" for
    # labels up to 6 with num_classes=3 given) and to suggest the num_classes already given.
    from lightning_fullgraph.strategies.fullgraph import _label_note
    datamodule = SimpleNamespace(max_label=top, num_classes_arg=given,
                                 num_classes=given if given is not None else top + 1)
    note = _label_note(datamodule, 5)
    assert note.startswith("lightning-fullgraph: target 5 is not below the model's number of "
                           "outputs;")
    assert expected in note, note
