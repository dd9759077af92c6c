"""Build hook: ship the C++ kernel sources inside built wheels.

All metadata is in ``pyproject.toml``. The C++ sources stay in the top-level ``csrc/`` of the
repository (one copy in git); a source or editable checkout compiles them from there. A wheel
has no ``csrc/`` next to the package, so ``build_py`` copies ``csrc/*.cpp`` and ``csrc/*.h``
into ``lightning_fullgraph/kernels/csrc/`` of the build directory, where
:func:`lightning_fullgraph.kernels.cpp.source_dir` looks in an installed package. The same
files are added to source distributions (``get_source_files``), so a wheel built from an sdist
has them too.
"""
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"
PACKAGE_CSRC = ("lightning_fullgraph", "kernels", "csrc")
PATTERNS = ("*.cpp", "*.h")


def _csrc_files():
    files = sorted(f for pattern in PATTERNS for f in CSRC.glob(pattern) if f.is_file())
    if not files:
        raise RuntimeError(f"no C++ sources ({', '.join(PATTERNS)}) in {CSRC}; "
                           "the wheel would lack the aggregation kernels")
    return files


class BuildPyWithCsrc(build_py):
    """``build_py`` that also copies the top-level C++ sources into the package."""

    def _csrc_targets(self):
        dst = Path(self.build_lib, *PACKAGE_CSRC)
        return [(src, dst / src.name) for src in _csrc_files()]

    def run(self):
        super().run()
        if self.editable_mode:  # an editable install compiles from <checkout>/csrc directly
            return
        for src, dst in self._csrc_targets():
            self.mkpath(str(dst.parent))
            self.copy_file(str(src), str(dst), preserve_mode=False)

    def get_outputs(self, include_bytecode=True):
        outputs = list(super().get_outputs(include_bytecode))
        if not self.editable_mode:
            outputs += [str(dst) for _, dst in self._csrc_targets()]
        return outputs

    def get_source_files(self):
        # Listed for sdists: relative paths, as setuptools' file list expects.
        return list(super().get_source_files()) + [
            str(src.relative_to(ROOT)) for src in _csrc_files()]


setup(cmdclass={"build_py": BuildPyWithCsrc})
