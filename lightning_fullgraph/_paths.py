r"""The library's one cache directory, which every on-disk cache of it sits in."""
import os
from pathlib import Path

#: Environment variable naming it (read when a path is needed: it only seeds the default).
CACHE_ENV = "LIGHTNING_FULLGRAPH_CACHE"


def cache_home() -> Path:
    r"""``$LIGHTNING_FULLGRAPH_CACHE``, else ``~/.cache/lightning_fullgraph``: partitions in
    ``partitions/``, the compiled kernels in ``ext/``, the benchmarks' result files in
    ``benchmarks/``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lightning_fullgraph"
