"""``strategy="fullgraph"`` and ``"4d"`` work whichever of this package and Lightning is
imported first, and importing the engine alone does not load Lightning."""
import subprocess
import sys

CHECK = """
import sys
{imports}
assert {lightning_loaded} == ("lightning.pytorch" in sys.modules), sys.modules.keys()
import lightning.pytorch as pl
for name, cls in (("fullgraph", "FullGraphStrategy"), ("4d", "FourDStrategy")):
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=name, logger=False)
    assert type(trainer.strategy).__name__ == cls, type(trainer.strategy)
import lightning_fullgraph
assert not any(type(f).__name__ == "_AfterLightning" for f in sys.meta_path)  # one-shot
print("OK")
"""


def _run(imports, lightning_loaded):
    code = CHECK.format(imports=imports, lightning_loaded=lightning_loaded)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]


def test_the_package_imported_before_lightning_registers_the_strategy_names():
    # The engine alone does not load Lightning; the names appear once Lightning is imported
    # (they used to exist only when this package was imported after Lightning).
    _run("import lightning_fullgraph\nimport lightning_fullgraph.engine", False)
