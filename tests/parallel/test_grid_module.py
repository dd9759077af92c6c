"""GridModule's per-batch adjacency blocks: a batch is its edge list, the very tensor,
unmodified and alive (not an address a later batch may be allocated at)."""
import copy
import pickle

import torch

from lightning_fullgraph.parallel.grid_module import GridModule


def test_a_batch_is_its_edge_list_unmodified():
    module = GridModule(mesh=None)
    edges = torch.tensor([[0, 1, 2], [1, 2, 0]])
    assert module.new_batch(edges, 3) and not module.new_batch(edges, 3)
    assert not module.new_batch(edges[:, :], 3)  # a view of it: the same batch
    assert module.new_batch(edges, 4)  # other vertices
    assert module.new_batch(edges.clone(), 4)  # an equal list made anew: another batch
    again = edges.clone()
    assert module.new_batch(again, 3) and not module.new_batch(again, 3)
    again[0, 0] = 2  # edited in place
    assert module.new_batch(again, 3)


def test_a_saved_module_starts_a_new_batch():
    module = GridModule(mesh=None)
    edges = torch.tensor([[0, 1], [1, 0]])
    module.new_batch(edges, 2)
    module._adjacency[("x", "y")] = (edges, None)
    for saved in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        assert saved._adjacency == {} and saved.new_batch(edges, 2)
    assert not module.new_batch(edges, 2)  # the original keeps its batch
