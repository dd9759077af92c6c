"""The huge-page CPU allocator (``kernels/huge_pages.py``, ``csrc/huge_pages.cpp``).

Large tensors allocated while it is installed are 2 MiB-aligned and their mapping carries
the kernel's huge-page advice (``hg`` in ``/proc/self/smaps``); small ones and all values
are untouched; a tensor outlives the allocator that made it; nothing leaks.  Modes come
from :func:`set_huge_pages` or the environment; torch's own switch and a machine without
transparent huge pages leave torch's allocator in place.
"""
import json
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

import lightning_fullgraph.kernels as K
from lightning_fullgraph.kernels import huge_pages as HP

from kernel_testutils import cpp_or_skip

HUGE = 2 << 20
BIG = 64 << 20  # bytes: 32 huge pages


def _mapping_of(ptr: int) -> dict:
    """VmFlags and AnonHugePages of the mapping holding ``ptr`` (Linux ``smaps``)."""
    found, out = False, {}
    with open("/proc/self/smaps") as fh:
        for line in fh:
            m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
            if m:
                if found:
                    break
                found = int(m.group(1), 16) <= ptr < int(m.group(2), 16)
            elif found and line.startswith("VmFlags:"):
                out["flags"] = line.split()[1:]
            elif found and line.startswith("AnonHugePages:"):
                out["anon_huge_kib"] = int(line.split()[1])
    return out


def _thp_or_skip():
    reason = HP._why_not()
    if reason is not None:
        pytest.skip(reason)
    if HP._torch_does_it():
        pytest.skip("THP_MEM_ALLOC_ENABLE=1: torch's own allocator places the tensors")


@pytest.fixture
def restore_mode():
    """Each test leaves the mode (and whether the allocator is installed) and the block
    cache's limit as it found them."""
    mode, active, cache = HP.get_huge_pages(), HP.is_active(), HP.get_block_cache()
    yield
    HP.set_huge_pages("off")
    HP._state["mode"] = mode
    if active:
        HP._install(explicit=True)
    HP.set_block_cache(cache)


def test_thp_mode_reads_the_bracketed_setting(tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert HP.thp_mode(f) == "madvise"
    f.write_text("[always] madvise never\n")
    assert HP.thp_mode(f) == "always"
    assert HP.thp_mode(tmp_path / "missing") is None


def test_mode_names_are_validated(restore_mode):
    with pytest.raises(ValueError, match="unknown huge-page mode 'sometimes'.*auto"):
        K.set_huge_pages("sometimes")
    assert HP._normalize("1") == "on" and HP._normalize("OFF") == "off"


def test_large_tensors_are_aligned_and_advised_small_ones_untouched(restore_mode):
    cpp_or_skip()
    _thp_or_skip()
    assert K.set_huge_pages("on") is True
    before = HP.huge_pages_info()["allocations"]
    big = torch.empty(BIG // 4, dtype=torch.float32)
    big.fill_(1.0)  # fault the pages in
    small = torch.empty(1000)
    info = HP.huge_pages_info()
    assert info["active"] and info["mode"] == "on"
    assert info["allocations"] == before + 1  # the big one only
    assert big.data_ptr() % HUGE == 0
    mapping = _mapping_of(big.data_ptr())
    assert "hg" in mapping["flags"], mapping
    assert info["bytes"] >= BIG
    assert small.numel() == 1000  # served by torch's default allocator (not counted)


def test_values_and_gradients_do_not_depend_on_the_allocator(restore_mode):
    cpp_or_skip()
    _thp_or_skip()
    results = []
    for mode in ("off", "on"):
        K.set_huge_pages(mode)
        torch.manual_seed(0)
        x = torch.randn(1 << 20, 8, requires_grad=True)  # 32 MiB
        y = (x * 2).relu().sum()
        y.backward()
        results.append((x.detach().clone(), x.grad.clone(), y.detach()))
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_a_tensor_outlives_the_allocator_and_nothing_leaks(restore_mode):
    cpp_or_skip()
    _thp_or_skip()
    K.set_huge_pages("on")
    kept = torch.ones(BIG // 4)
    K.set_huge_pages("off")
    assert not HP.is_active()
    count = HP.huge_pages_info()["allocations"]
    other = torch.ones(BIG // 4)
    assert HP.huge_pages_info()["allocations"] == count  # torch's allocator again
    assert float(kept.sum()) == BIG // 4
    del kept, other  # freed by the deleter of the allocator that made them

    K.set_huge_pages("on")
    K.set_block_cache(0)  # what the cache would keep is tested below

    def rss_kib():
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))

    start = rss_kib()
    for _ in range(40):  # 2.5 GiB allocated and freed in all
        t = torch.empty(BIG // 4)
        t.fill_(2.0)
        del t
    assert rss_kib() - start < 3 * BIG // 1024, "large blocks are not given back"


def test_a_freed_block_goes_back_to_the_kernel_at_once(restore_mode):
    # glibc keeps freed blocks below its mmap threshold in its heap (resident, unused by any
    # tensor); the threshold rises to the size of the last mmapped block freed, up to 32 MiB.
    cpp_or_skip()
    _thp_or_skip()
    K.set_huge_pages("on")
    K.set_block_cache(0)  # without the cache (which keeps it on purpose)
    raised = bytearray(24 << 20)  # a 24 MiB malloc, then its free: threshold now 24 MiB
    del raised
    t = torch.empty((4 << 20) // 4)
    t.fill_(1.0)
    ptr = t.data_ptr()
    assert ptr % HUGE == 0 and _mapping_of(ptr)
    del t
    assert not _mapping_of(ptr), "a freed 4 MiB block is still mapped (kept in a heap)"


def test_handle_restores_what_was_in_effect(restore_mode):
    cpp_or_skip()
    _thp_or_skip()
    K.set_huge_pages("off")
    K.set_huge_pages("auto")  # selects the mode; installs nothing by itself
    assert not HP.is_active()
    handle = HP.enable_for_kernels()
    assert handle.installed and HP.is_active()
    again = HP.enable_for_kernels()  # already installed: nothing of its own to undo
    assert not again.installed
    again.revert()
    assert HP.is_active()
    handle.revert()
    assert not HP.is_active() and K.get_huge_pages() == "auto"

    # False: torch's allocator for the run, and the mode "off" so no later load installs it.
    K.set_huge_pages("on")
    forced_off = HP.enable_for_kernels(False)
    assert not HP.is_active() and K.get_huge_pages() == "off" and not forced_off.installed
    forced_off.revert()
    assert HP.is_active() and K.get_huge_pages() == "on"

    # True: installed even where the mode said "off"; the mode comes back afterwards.
    K.set_huge_pages("off")
    forced_on = HP.enable_for_kernels(True)
    assert HP.is_active() and forced_on.installed
    forced_on.revert()
    assert not HP.is_active() and K.get_huge_pages() == "off"
    assert not HP.enable_for_kernels().installed and not HP.is_active()  # "off" is respected


def _in_fresh_process(env_update: dict) -> dict:
    code = ("import json, torch, lightning_fullgraph.kernels as K; K.cpp_available(); "
            "x = torch.ones(1 << 24); print(json.dumps(dict(K.huge_pages_info(), "
            "aligned=x.data_ptr() % (2 << 20) == 0)))")
    env = dict(os.environ)
    env.pop("THP_MEM_ALLOC_ENABLE", None)
    env.pop(HP.ENV, None)
    env.pop(HP.CACHE_ENV, None)
    env.update(env_update)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_loading_the_kernels_changes_no_allocator_unless_asked():
    cpp_or_skip()
    _thp_or_skip()
    # Nothing global by default: loading (and using) the kernels keeps torch's allocator.
    default = _in_fresh_process({})
    assert default["mode"] == "off" and not default["active"]
    assert default["allocations"] == 0
    # The environment seeds the mode: "auto" installs it as the kernels load, "1" too.
    auto = _in_fresh_process({HP.ENV: "auto"})
    assert auto["mode"] == "auto" and auto["active"] and auto["aligned"]
    assert auto["allocations"] >= 1
    assert _in_fresh_process({HP.ENV: "1"})["active"]
    torch_own = _in_fresh_process({HP.ENV: "auto", "THP_MEM_ALLOC_ENABLE": "1"})
    assert torch_own["torch_thp"] and not torch_own["active"]  # torch does it already


def test_use_huge_pages_is_scoped(restore_mode):
    cpp_or_skip()
    _thp_or_skip()
    HP.set_huge_pages("off")
    with K.use_huge_pages() as handle:
        assert HP.is_active() and handle.installed
        x = torch.ones(1 << 22)
        assert x.data_ptr() % (2 << 20) == 0
    assert not HP.is_active() and K.get_huge_pages() == "off"
    del x  # a tensor allocated inside may outlive the block


def test_an_unknown_environment_value_warns_and_means_off(monkeypatch):
    monkeypatch.setenv(HP.ENV, "maybe")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert HP._mode_from_env() == "off"
    assert any("LIGHTNING_FULLGRAPH_HUGE_PAGES='maybe'" in str(w.message) for w in caught)


def test_on_warns_where_the_machine_has_no_transparent_huge_pages(restore_mode, monkeypatch,
                                                                  tmp_path):
    cpp_or_skip()
    if HP._torch_does_it():
        pytest.skip("THP_MEM_ALLOC_ENABLE=1: nothing to install")
    never = tmp_path / "enabled"
    never.write_text("always madvise [never]\n")
    monkeypatch.setattr(HP, "_SYSFS", never)
    K.set_huge_pages("off")
    with pytest.warns(RuntimeWarning, match="transparent huge pages are off on this machine"):
        assert K.set_huge_pages("on") is False
    assert not HP.is_active()


# --------------------------------------------------------------------------- block cache
@pytest.fixture
def block_cache(restore_mode):
    """The allocator on, its cache off and empty before and after."""
    cpp_or_skip()
    _thp_or_skip()
    K.set_huge_pages("on")
    K.set_block_cache(0)
    yield
    K.set_block_cache(0)


def _minor_faults() -> int:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_block_cache_fills_a_new_block_with_a_freed_blocks_pages(block_cache):
    K.set_block_cache("64M")
    info = K.huge_pages_info()
    t = torch.full((BIG // 4,), 3.0)
    ptr = t.data_ptr()
    del t
    assert K.huge_pages_info()["cached_bytes"] == BIG and _mapping_of(ptr)  # kept mapped
    start = _minor_faults()
    u = torch.empty(BIG // 4)
    u.fill_(2.0)
    # Its pages were moved, not faulted in afresh (a fresh block: one fault per 2 MiB or more).
    assert _minor_faults() - start < BIG // HUGE // 2
    now = K.huge_pages_info()
    assert now["reused"] == info["reused"] + 1
    assert now["reused_bytes"] == info["reused_bytes"] + BIG and now["cached_bytes"] == 0
    assert not _mapping_of(ptr)  # the pages left their old place
    assert u.data_ptr() % HUGE == 0 and "hg" in _mapping_of(u.data_ptr())["flags"]
    assert bool((u == 2.0).all())  # a filled block is just memory: values are the writer's


def test_block_cache_fills_blocks_of_any_length(block_cache):
    K.set_block_cache("1G")
    t = torch.ones(BIG // 4)
    del t
    before = K.huge_pages_info()
    small = torch.ones(BIG // 16)  # a quarter of the freed pages
    after = K.huge_pages_info()
    assert after["reused_bytes"] == before["reused_bytes"] + BIG // 4
    assert after["cached_bytes"] == BIG - BIG // 4  # the rest stays cached
    odd = torch.ones(BIG // 16 + 1000)  # whole huge pages from the cache, the tail fresh
    assert K.huge_pages_info()["reused_bytes"] == after["reused_bytes"] + BIG // 4
    assert float(odd.sum()) == BIG // 16 + 1000 and float(small.sum()) == BIG // 16
    held = K.huge_pages_info()["cached_bytes"]
    del odd  # its whole huge pages are cached again, its tail below 2 MiB is unmapped
    assert K.huge_pages_info()["cached_bytes"] == held + BIG // 4


@pytest.mark.parametrize("by_huge_page", [False, True], ids=["whole", "by-huge-page"])
def test_block_cache_fills_a_block_from_several_freed_ones_and_moves_it_again(block_cache,
                                                                              by_huge_page):
    # A block filled from three cached ranges spans three mappings.  Before Linux 6.17 one
    # mremap() cannot move it whole, so the next fill moves it 2 MiB at a time ("by-huge-page"
    # forces that path on every kernel).  Nothing may be left unmapped.
    from lightning_fullgraph.kernels import cpp
    ext = cpp.load()
    K.set_block_cache("1G")
    ext._huge_pages_move_by_huge_page(by_huge_page)
    try:
        parts = [torch.full((BIG // 16,), float(i)) for i in range(3)]  # 3 x 16 MiB
        del parts
        whole = torch.empty(3 * BIG // 16)
        assert K.huge_pages_info()["cached_bytes"] == 0
        assert sorted(whole.view(3, -1)[:, 0].tolist()) == [0.0, 1.0, 2.0]  # pages moved
        whole.fill_(5.0)
        del whole
        before = K.huge_pages_info()
        start = _minor_faults()
        again = torch.empty(3 * BIG // 16)
        again.fill_(7.0)
        nbytes = again.numel() * 4  # 48 MiB
        assert _minor_faults() - start < nbytes // HUGE // 2
        assert K.huge_pages_info()["reused_bytes"] == before["reused_bytes"] + nbytes
        assert float(again.sum()) == 7.0 * again.numel()
    finally:
        ext._huge_pages_move_by_huge_page(False)


def test_block_cache_limit_and_trim(block_cache):
    K.set_block_cache(BIG + HUGE)  # room for one block and one huge page
    a, b = torch.ones(BIG // 4), torch.ones(BIG // 4)
    ptr_b = b.data_ptr()
    del a, b  # the first is kept, the second up to the limit: the rest is unmapped at once
    info = K.huge_pages_info()
    assert info["cached_bytes"] == BIG + HUGE and info["cached_blocks"] == 2
    assert _mapping_of(ptr_b) and not _mapping_of(ptr_b + HUGE)
    K.set_block_cache(BIG // 2)  # lowered: what exceeds it is unmapped, oldest first
    assert K.huge_pages_info()["cached_bytes"] <= BIG // 2
    K.clear_memos()  # the kernels' clear_memos gives the cached pages back too
    assert K.huge_pages_info()["cached_bytes"] == 0 and not _mapping_of(ptr_b)
    K.set_block_cache("64M")
    c = torch.ones(BIG // 4)
    ptr_c = c.data_ptr()
    del c
    K.set_block_cache(0)  # off: what it holds is unmapped
    assert K.huge_pages_info()["cached_bytes"] == 0 and not _mapping_of(ptr_c)


def test_block_cache_never_holds_more_than_the_live_peak(block_cache):
    # Fresh pages go into a block only when the cache is empty, so live + cached never
    # exceeds the live peak (all lengths here are whole huge pages: no fresh tails).
    from lightning_fullgraph.kernels import cpp
    K.set_block_cache("1G")
    before = K.huge_pages_info()["reused"]
    for sizes in ([BIG, BIG // 2, BIG], [BIG // 4, 3 * BIG // 2], [BIG // 4],
                  [BIG, BIG // 2, BIG], [2 * BIG, BIG // 4]):
        held = [torch.ones(n // 4) for n in sizes]
        del held
    stats = cpp.load().huge_pages_stats()
    live_peak, held_peak = stats[3], stats[4]
    assert held_peak == live_peak
    assert K.huge_pages_info()["reused"] > before


def test_block_cache_values_and_gradients_are_unchanged(block_cache):
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 256)
    x = torch.randn(8192, 256)
    want = torch.autograd.grad(lin(x).square().sum(), list(lin.parameters()))
    K.set_block_cache("256M")
    for _ in range(3):  # the later rounds run in reused blocks
        got = torch.autograd.grad(lin(x).square().sum(), list(lin.parameters()))
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    assert K.huge_pages_info()["reused"] > 0


def test_block_cache_limits_are_parsed_and_checked(monkeypatch):
    assert HP._parse_bytes("2G") == 2 << 30 and HP._parse_bytes("512MiB") == 512 << 20
    assert HP._parse_bytes(4096) == 4096 and HP._parse_bytes("1.5k") == 1536
    for bad in ("lots", "-1", "3X"):
        with pytest.raises(ValueError, match="block cache limit"):
            HP._parse_bytes(bad)
    monkeypatch.setenv(HP.CACHE_ENV, "plenty")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert HP._cache_from_env() == 0  # a value it cannot read turns the cache off
    assert any("LIGHTNING_FULLGRAPH_HUGE_PAGES_CACHE" in str(w.message) for w in caught)
    monkeypatch.delenv(HP.CACHE_ENV)
    assert HP._cache_from_env() == HP.default_block_cache()


def test_block_cache_from_the_environment():
    cpp_or_skip()
    _thp_or_skip()
    default = _in_fresh_process({})  # on by default, capped by the machine's memory
    assert default["cache_limit"] == HP.default_block_cache() > 0
    assert _in_fresh_process({HP.CACHE_ENV: "1G"})["cache_limit"] == 1 << 30
    assert _in_fresh_process({HP.CACHE_ENV: "0"})["cache_limit"] == 0


def test_block_cache_is_emptied_when_the_allocator_goes(block_cache):
    K.set_block_cache("64M")
    t = torch.ones(BIG // 4)
    u = torch.ones(BIG // 4)
    ptr_u = u.data_ptr()
    del t
    assert K.huge_pages_info()["cached_blocks"] == 1
    K.set_huge_pages("off")  # uninstalled: what it holds could never be handed out again
    assert K.huge_pages_info()["cached_bytes"] == 0
    del u  # freed after uninstall: unmapped, not kept
    assert K.huge_pages_info()["cached_bytes"] == 0 and not _mapping_of(ptr_u)
