"""The `lightning run model` command: forwarding to Fabric's launcher and its errors (no processes).

The end-to-end launch is ``tests/launch/test_launchers.py::test_lightning_run_model``.
"""
import sys

import pytest

from lightning_fullgraph import lightning_command


@pytest.fixture
def launched(monkeypatch):
    """Replace the function behind `fabric run` that starts torchrun; record its arguments."""
    from lightning.fabric import cli

    calls = []
    monkeypatch.setattr(cli, "main", lambda args, script_args=None: calls.append((args, script_args)))
    return calls


def test_run_model_forwards_to_fabric_run(launched, tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    with pytest.raises(SystemExit) as exit_info:
        lightning_command.main(["run", "model", "--accelerator", "cpu", "--devices", "2",
                                "--num-nodes", "1", str(script), "--epochs", "30", "--lr", "0.1"])
    assert exit_info.value.code == 0
    assert len(launched) == 1
    args, script_args = launched[0]
    assert args.script == str(script)
    assert (args.accelerator, args.devices, args.num_nodes) == ("cpu", "2", 1)
    assert script_args == ["--epochs", "30", "--lr", "0.1"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "`fabric run`" in err  # a one-line note


def test_run_model_help_and_usage_errors(launched, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        lightning_command.main(["run", "model", "--help"])
    assert exit_info.value.code == 0
    assert "Usage: lightning run model [OPTIONS] SCRIPT [SCRIPT_ARGS]..." in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:  # click's own error: the script does not exist
        lightning_command.main(["run", "model", str(tmp_path / "missing.py")])
    assert exit_info.value.code == 2
    assert "does not exist" in capsys.readouterr().err
    assert launched == []


@pytest.mark.parametrize("argv, named", [
    (["run", "app", "app.py"], "`lightning run app`"),
    (["run"], "`lightning run`"),
    (["serve", "model.ckpt"], "`lightning serve`"),
    (["model", "train.py"], "`lightning model`"),
])
def test_other_commands_are_clear_errors(argv, named, capsys):
    assert lightning_command.main(argv) == 2
    err = capsys.readouterr().err
    assert f"unsupported command {named}" in err
    assert "Supported: `lightning run model`" in err and "fabric run" in err


def test_no_arguments_prints_usage(capsys):
    assert lightning_command.main([]) == 2
    assert "usage: lightning run model [OPTIONS] SCRIPT" in capsys.readouterr().err
    assert lightning_command.main(["--help"]) == 0
    assert "supports only: run model" in capsys.readouterr().out


def test_missing_click_names_the_fabric_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "click", None)  # `import click` raises ImportError
    script = tmp_path / "train.py"
    script.write_text("")
    assert lightning_command.main(["run", "model", str(script)]) == 2
    err = capsys.readouterr().err
    assert "needs the 'click' package" in err
    assert "pip install 'lightning-fullgraph[fabric]'" in err
