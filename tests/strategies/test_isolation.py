"""Nothing outside the model changes: importing the package, building the strategy and a fit
leave torch's CPU allocator, its thread count, PyG's ``gcn_norm`` bindings and torch's global
module hooks as they were, during the fit (except ``gcn_norm``, routed while a model is
attached) and after teardown."""
import pytest

from lightning_fullgraph.testing import run_distributed


def _state():
    import sys

    import torch
    from torch.nn.modules import module as torch_module
    hooks = {name: tuple(getattr(torch_module, name)) for name in dir(torch_module)
             if name.startswith("_global_") and name.endswith("hooks")}
    bindings = {name: id(mod.gcn_norm) for name, mod in list(sys.modules.items())
                if name.startswith("torch_geometric") and hasattr(mod, "gcn_norm")}
    allocator = None
    if "lightning_fullgraph.kernels.huge_pages" in sys.modules:
        allocator = sys.modules["lightning_fullgraph.kernels.huge_pages"].is_active()
    return dict(threads=torch.get_num_threads(), hooks=hooks, gcn_norm=bindings,
                allocator=bool(allocator))


def _fit(rank, world_size, tmp):
    import torch
    before = _state()  # torch and PyG imported, this library not yet
    import lightning.pytorch as pl

    import lightning_fullgraph
    from lightning_fullgraph import FullGraphDataModule, FullGraphStrategy, TimeoutConfig
    imported = _state()
    strategy = FullGraphStrategy(timeout=TimeoutConfig(collectives=60))  # kernels="auto"
    built = _state()

    from ..engine.models import skewed_graph
    from .modules import NodeClassifier
    during = {}

    class Probe(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            during.update(_state())

    torch.manual_seed(0)
    trainer = pl.Trainer(accelerator="cpu", devices=world_size, strategy=strategy,
                         max_epochs=2, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False,
                         num_sanity_val_steps=0, default_root_dir=tmp, callbacks=[Probe()])
    trainer.fit(NodeClassifier(8, 4, conv="gcn"),
                datamodule=FullGraphDataModule(skewed_graph(), cache_dir=f"{tmp}/cache"))
    after = _state()
    assert lightning_fullgraph.__version__
    return dict(before=before, imported=imported, built=built, during=during, after=after)


@pytest.mark.multiprocess
def test_a_fit_changes_nothing_outside_the_model(tmp_path):
    for r in run_distributed(_fit, 2, str(tmp_path)):
        before = r["before"]
        assert before["gcn_norm"], "PyG's gcn_norm is bound somewhere"
        for when in ("imported", "built", "during", "after"):
            state = r[when]
            assert state["threads"] == before["threads"], (when, state["threads"])
            assert state["allocator"] is False, when  # torch's own CPU allocator
            assert state["hooks"] == before["hooks"], (when, state["hooks"])
            # PyG modules imported since may bind gcn_norm too: the ones before keep theirs.
            same = {k: v for k, v in state["gcn_norm"].items() if k in before["gcn_norm"]}
            if when != "during":  # (routed to the engine's dispatcher while attached)
                assert same == before["gcn_norm"], when
