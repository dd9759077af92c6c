"""``kernels.setting.ModeSetting``: the value set in code wins, else the environment's (read
once, again after ``set(None)``), else the first mode; bad values are refused naming the
setting and its modes."""
import pytest

from lightning_fullgraph.kernels.setting import ModeSetting

ENV = "LIGHTNING_FULLGRAPH_TEST_SETTING"


def test_code_then_environment_then_default(monkeypatch):
    s = ModeSetting("test mode", ("auto", "off"), ENV)
    monkeypatch.delenv(ENV, raising=False)
    assert s.get() == "auto"
    monkeypatch.setenv(ENV, " OFF ")
    assert s.get() == "auto"  # read once: it seeds the default, not every call
    s.set(None)
    assert s.get() == "off"  # read again after set(None), trimmed, any case
    s.set("auto")
    assert s.get() == "auto"  # code wins over the environment
    s.set(None)
    assert s.get() == "off"
    monkeypatch.setenv(ENV, "")
    s.set(None)
    assert s.get() == "auto"


def test_bad_values_name_the_setting(monkeypatch):
    s = ModeSetting("test mode", ("auto", "off"), ENV)
    with pytest.raises(ValueError, match=r"test mode must be one of \('auto', 'off'\), got 'sometimes'"):
        s.set("sometimes")
    monkeypatch.setenv(ENV, "sometimes")
    s.set(None)
    with pytest.raises(ValueError, match=rf"{ENV}='sometimes': must be one of"):
        s.get()


@pytest.mark.parametrize("setter, getter, env, other", [
    ("set_locality", "get_locality", "LIGHTNING_FULLGRAPH_LOCALITY", "off"),
    ("set_static_inputs", "get_static_inputs", "LIGHTNING_FULLGRAPH_STATIC_INPUTS", "off"),
    ("set_layer_order", "get_layer_order", "LIGHTNING_FULLGRAPH_LAYER_ORDER", "pyg"),
])
def test_the_kernels_switches_follow_it(setter, getter, env, other, monkeypatch):
    import lightning_fullgraph.kernels as K

    set_, get = getattr(K, setter), getattr(K, getter)
    monkeypatch.setenv(env, other)
    try:
        set_(None)
        assert get() == other
        set_("auto")
        assert get() == "auto"
        with pytest.raises(ValueError, match="must be one of"):
            set_("nonsense")
        set_(None)
        monkeypatch.setenv(env, "sometimes")
        with pytest.raises(ValueError, match=env):
            get()
    finally:
        set_(None)
