"""Partitioned full-graph training from a YAML file, with Lightning's ``LightningCLI``.

    python examples/cli/train.py fit --config examples/cli/config.yaml
    python examples/cli/train.py fit --config examples/cli/config.yaml \\
        --trainer.devices=4 --trainer.strategy.init_args.exchange.aggregation=post
    python examples/cli/train.py fit --config examples/cli/config.yaml --print_config

Everything is chosen by class path in ``config.yaml``: the strategy
(``lightning_fullgraph.FullGraphStrategy`` and its options), the data module
(``lightning_fullgraph.FullGraphDataModule`` over the embedded Cora graph, named by a string)
and the model (``lightning_fullgraph.module.NodeClassifier`` around a PyG model).  With
``trainer.devices: N`` on CPU, Lightning re-runs this script once per extra process, and each
re-reads the same configuration.  Needs ``jsonargparse[signatures]`` (``pip install
'jsonargparse[signatures]'``, or the ``test`` extra of this package).
"""
from lightning.pytorch.cli import LightningCLI

import lightning_fullgraph.strategies  # noqa: F401  (also registers strategy="fullgraph")


def main(args=None) -> None:
    r"""Runs the CLI (:obj:`args`: a list instead of ``sys.argv``, as ``LightningCLI`` takes)."""
    # No model or data module class fixed here: both come by class path from the config.
    # overwrite: a second run in the same log directory replaces the saved config.yaml.
    LightningCLI(save_config_kwargs={"overwrite": True}, args=args)


if __name__ == "__main__":
    main()
