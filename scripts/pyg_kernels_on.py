"""A pytest plugin that runs PyG's own tests with this library's kernels switched on globally.

Used by scripts/pyg_tests.sh (``-p pyg_kernels_on``): before every test, ``K.use(BACKEND)``
(``$PYG_KERNELS``, default ``cpp``) switches every supported PyG layer to the kernels, as a user
who calls ``kernels.use`` would. At the end it prints how many aggregations went through the
kernels' CSR path, and fails the session when none did (the switch would not have been tested).
"""
import os

import pytest

import lightning_fullgraph.kernels as K

BACKEND = os.environ.get("PYG_KERNELS", "cpp")


@pytest.fixture(autouse=True)
def _kernels_on():
    K.use(BACKEND)
    assert K.current() == BACKEND
    yield


def pytest_sessionfinish(session, exitstatus):
    if session.config.pluginmanager.hasplugin("dsession"):
        return  # pytest-xdist's controller runs no test: its workers count their own
    info = K.memo_info()
    calls = info["hits"] + info["misses"]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_line(f"[pyg_kernels_on] backend {BACKEND}: {calls} CSR lookups by the "
                            f"kernels in this process ({info})")
    if calls == 0 and session.testscollected and exitstatus == 0:
        session.exitstatus = 1
