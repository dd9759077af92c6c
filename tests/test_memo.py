"""TensorMemo: the one memo of "the same, unchanged input" (lightning_fullgraph/memo.py)."""
import gc

import torch

from lightning_fullgraph.memo import TensorMemo, anchor, signature


def test_answers_only_for_the_same_unchanged_tensor():
    memo = TensorMemo()
    x = torch.randn(4, 3)
    memo.put("k", (x, 2), "value")
    assert memo.get("k", (x, 2)) == "value"
    assert memo.get("k", (x.clone(), 2)) is None  # equal values, another tensor
    assert memo.get("k", (x, 3)) is None  # another plain value
    assert memo.get("k", (x[:, :], 2)) == "value"  # a view with the same geometry
    assert memo.get("k", (x[:2], 2)) is None  # another geometry
    x.add_(1)  # an in-place edit bumps the version
    assert memo.get("k", (x, 2)) is None
    assert (memo.hits, memo.misses) == (2, 4)


def test_an_entry_goes_with_what_it_follows():
    memo = TensorMemo()
    x = torch.randn(4, 3)
    layer = torch.nn.Linear(3, 3)
    memo.put("k", (x[:, :],), torch.ones(2), follow=(layer,))  # follows x, the view's base
    assert len(memo) == 1
    del layer
    gc.collect()
    assert len(memo) == 0
    memo.put("k", (x,), torch.ones(2))
    del x
    gc.collect()
    assert len(memo) == 0


def test_a_kept_value_edited_in_place_is_not_answered():
    memo = TensorMemo()
    x, out = torch.randn(4, 3), torch.zeros(4)
    memo.put("k", (x,), (out, 1))
    assert memo.get("k", (x,))[0] is out
    out.add_(1)
    assert memo.get("k", (x,)) is None


def test_bounded_least_recently_used_first():
    memo = TensorMemo(size=2)
    xs = [torch.randn(2) for _ in range(3)]
    memo.put(0, (xs[0],), 0)
    memo.put(1, (xs[1],), 1)
    assert memo.get(0, (xs[0],)) == 0  # 0 is now the most recent
    memo.put(2, (xs[2],), 2)
    assert [k for k, *_ in memo.items()] == [0, 2]
    memo.set_size(0)
    memo.put(3, (xs[0],), 3)
    assert len(memo) == 0


def test_hold_keeps_the_inputs_and_replacing_an_entry_keeps_the_new_one():
    memo = TensorMemo(hold=True)
    x = torch.arange(6)
    memo.put("k", (x,), "csr", extra="fingerprint")
    ((key, value, (held,), extra),) = list(memo.items())
    assert (key, value, extra) == ("k", "csr", "fingerprint") and held is x
    old = x
    del x
    gc.collect()
    assert memo.get("k", (old,)) == "csr"  # held: still there
    # The callback of a replaced entry's followed object never drops its successor.
    follow = TensorMemo()
    a, b = torch.randn(2), torch.randn(2)
    follow.put("k", (a,), 1)
    follow.put("k", (b,), 2)
    del a
    gc.collect()
    assert follow.get("k", (b,)) == 2


def test_signature_and_anchor():
    x = torch.randn(4, 3)
    assert signature(x) == signature(x[:, :]) and anchor(x[:, :]) is x and anchor(x) is x
    assert signature(x) != signature(x.t())
    before = signature(x)
    x.mul_(2)
    assert signature(x)[:-1] == before[:-1] and signature(x)[-1] != before[-1]


def test_nbytes_counts_the_kept_values_tensors():
    memo = TensorMemo()
    x = torch.randn(2)
    memo.put("k", (x,), (torch.zeros(4), 3))
    assert memo.nbytes() == 4 * 4
