"""The documentation: the Sphinx site builds with warnings as errors, the code on its pages runs,
the benchmark tables come from the results file, and the README is a front page whose links
resolve and whose example runs.

Code on the pages runs page by page: its blocks, in order, as one script that a fresh
interpreter runs as ``python page.py`` (so ``if __name__ == "__main__":`` bodies run and the
processes they start import the page by its file name). Every ```python block runs, and every
```{code-block} python block unless its options say ``:class: no-run`` (kept for code that
needs several machines or processes it cannot have here). Edits keep it short: ``devices=N``
becomes ``devices=1``, ``max_epochs=N`` becomes ``max_epochs=2`` and ``epochs=N`` becomes
``epochs=3``.

Without the docs extra (sphinx, myst-parser) the build tests skip, except under CI
(``LIGHTNING_FULLGRAPH_CI=1``), which installs it: there they fail.
"""
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .environment import fresh_environment

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
PAGES = sorted(p.stem for p in DOCS.glob("*.md"))

FENCE = re.compile(r"^```(python|\{code-block\} python)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def page_blocks(text):
    """(code, runs) for every Python block of a Markdown page, in order."""
    blocks = []
    for kind, body in FENCE.findall(text):
        options = []
        if kind != "python":
            lines = body.split("\n")
            while lines and lines[0].startswith(":"):
                options.append(lines.pop(0))
            body = "\n".join(lines).lstrip("\n")
        runs = not any(o.startswith(":class:") and "no-run" in o.split() for o in options)
        blocks.append((body, runs))
    return blocks


def runnable_code(page):
    code = "\n".join(body for body, runs in page_blocks((DOCS / f"{page}.md").read_text()) if runs)
    code = re.sub(r"\bdevices=\d+", "devices=1", code)
    code = re.sub(r"\bmax_epochs=\d+", "max_epochs=2", code)
    return re.sub(r"\bepochs=\d+", "epochs=3", code)


def need_sphinx():
    try:
        import myst_parser  # noqa: F401
        import sphinx  # noqa: F401
    except ImportError:
        if os.environ.get("LIGHTNING_FULLGRAPH_CI") == "1":
            raise  # CI installs the docs extra: a missing Sphinx is a failure there
        pytest.skip("the docs extra (sphinx, myst-parser) is not installed")


def sphinx_build(src, out, *extra):
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html",
                           "-q", *extra, str(src), str(out)],
                          capture_output=True, text=True, timeout=600)


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    need_sphinx()
    proc = sphinx_build(DOCS, tmp_path / "html")
    assert proc.returncode == 0, proc.stderr[-4000:]
    for page in PAGES:
        assert (tmp_path / "html" / f"{page}.html").is_file(), page
    api = (tmp_path / "html" / "api.html").read_text()
    import lightning_fullgraph
    for name in lightning_fullgraph.__all__:
        if name != "__version__":
            assert f'id="lightning_fullgraph.{name}"' in api, name
    # The benchmark tables are rendered from benchmarks/results.json, with their commands.
    results = json.loads((ROOT / "benchmarks" / "results.json").read_text())
    html = (tmp_path / "html" / "benchmarks.html").read_text()
    used = re.findall(r"```\{benchmark-table\} (\S+)", (DOCS / "benchmarks.md").read_text())
    assert used
    for topic in used:
        assert results[topic]["title"].split(":")[0].replace("'", "&#39;") in html, topic


SAMPLE = {"demo": {"title": "A sample topic", "command": "python -m benchmarks demo --epochs 3",
                   "measured": "2026-11-28", "setup": "A sample set-up paragraph.",
                   "columns": ["model", "config", "step s"],
                   "rows": [["GraphSAGE", "post", 0.764], ["GCN", "hybrid", None]],
                   "notes": "A sample note."}}


@pytest.mark.parametrize("topic", ["demo", "missing"])
def test_the_benchmark_table_directive(tmp_path, topic):
    need_sphinx()
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(DOCS / "_ext")!r})
        extensions = ["myst_parser", "benchmark_tables"]
        benchmark_results = {str(tmp_path / "results.json")!r}
        """))
    (src / "index.md").write_text(f"# Sample\n\n```{{benchmark-table}} {topic}\n```\n")
    (tmp_path / "results.json").write_text(json.dumps(SAMPLE))
    proc = sphinx_build(src, tmp_path / "html")
    if topic == "missing":  # a topic the file lacks fails the build under -W
        assert proc.returncode != 0 and "no topic 'missing'" in proc.stderr, proc.stderr
        (tmp_path / "results.json").unlink()  # so does a missing file
        proc = sphinx_build(src, tmp_path / "html2")
        assert proc.returncode != 0 and "does not exist" in proc.stderr, proc.stderr
        return
    assert proc.returncode == 0, proc.stderr[-4000:]
    html = re.sub(r"<[^>]+>", "", (tmp_path / "html" / "index.html").read_text())
    for text in ("A sample topic", "A sample set-up paragraph.", "python -m benchmarks demo",
                 "GraphSAGE", "0.764", "A sample note."):
        assert text in html, text


def test_most_code_blocks_run():
    blocks = [runs for page in PAGES for _, runs in page_blocks((DOCS / f"{page}.md").read_text())]
    assert len(blocks) >= 8 and sum(blocks) >= 0.75 * len(blocks), blocks


def run_script(code, tmp_path, name):
    """Runs :obj:`code` as ``python name.py`` in a fresh interpreter, as a reader would.

    A separate process, not ``exec`` in the test's: code that trains leaves Lightning's
    rendezvous variables (``MASTER_PORT``), an open process group and attached models behind,
    and the tests that run after it in the same worker would meet them. The pages' code is
    checked for running, not for speed: it does not wait for (or start) a build of the C++
    kernels, which have their own tests.
    """
    script = tmp_path / f"{name}.py"
    script.write_text(code)
    env = fresh_environment(LIGHTNING_FULLGRAPH_NO_EXT="1", PYTHONPATH=str(ROOT),
               LIGHTNING_FULLGRAPH_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.parametrize("page", [p for p in PAGES if runnable_code(p).strip()])
def test_the_page_code_runs(page, tmp_path):
    # A page whose code starts processes has `if __name__ == "__main__":` bodies; they run as
    # `python page.py` runs them, and the processes import the page by its file name.
    code = "import torch\ntorch.manual_seed(0)\n" + runnable_code(page)
    run_script(code, tmp_path, "docs_page_" + page.replace("-", "_"))


def test_the_readme_is_a_front_page_whose_links_resolve():
    assert len(README.splitlines()) <= 300
    assert "bash scripts/demo.sh" in README and "bash scripts/test.sh" in README
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "bash scripts/test.sh" in ci  # the README's test command is what CI runs
    assert "python -m sphinx -b html docs docs/_build/html" in README
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_the_readme_example_runs(tmp_path):
    # The example as printed, on one process for two epochs, with Cora and a LightningModule of
    # the library's tests standing in for the user's `data` and `module`.
    code = re.search(r"## Your own script.*?```python\n(.*?)```", README, re.S).group(1)
    code = code.replace("devices=4", "devices=1").replace("max_epochs=200", "max_epochs=2")
    code = code.replace('accelerator="cpu",', 'accelerator="cpu", logger=False, '
                        'enable_checkpointing=False, enable_progress_bar=False,')
    prelude = ("import torch\n"
               "from lightning_fullgraph.data import load_cora\n"
               "from tests.strategies.modules import NodeClassifier\n"
               "torch.manual_seed(0)\n"
               "data = load_cora()\n"
               "module = NodeClassifier(data.num_features, 7)\n")
    out = run_script(prelude + code + "\nprint('FINISHED', trainer.state.finished)\n",
                     tmp_path, "readme_example")
    assert "FINISHED True" in out


def _layout_sections():
    r"""``{package directory: text}`` of the layout page's tree (``""``: the top level)."""
    text = (DOCS / "layout.md").read_text()
    block = text.split("```\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert block[0] == "lightning_fullgraph/"
    sections, parent, current = {}, "", ""
    for line in block[1:]:
        if not line.startswith(" "):
            break  # csrc/, examples/, ...: outside the package
        m = re.match(r"^( {2,4})([a-z_]+)/\s", line)
        if m:
            nested = len(m.group(1)) == 4
            current = f"{parent}/{m.group(2)}" if nested else m.group(2)
            parent = parent if nested else m.group(2)
        elif not line.startswith(" " * 5):
            current = parent = ""  # the package's own modules
        sections[current] = sections.get(current, "") + " " + line
    return sections


def test_the_layout_page_names_every_module():
    sections = _layout_sections()
    package = ROOT / "lightning_fullgraph"
    missing = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        where = path.parent.relative_to(package).as_posix()
        where = "" if where == "." else where
        if not re.search(rf"(?<![\w.]){re.escape(path.name)}\b", sections.get(where, "")):
            missing.append(path.relative_to(package).as_posix())
    assert not missing, f"docs/layout.md does not name {missing}"


def test_every_environment_variable_is_documented():
    # The library reads each only to seed a default; the troubleshooting page lists them all.
    sources = [*(ROOT / "lightning_fullgraph").rglob("*.py"), *(ROOT / "csrc").glob("*.cpp")]
    read = {name for path in sources
            for name in re.findall(r"LIGHTNING_FULLGRAPH_[A-Z_]*[A-Z]", path.read_text())}
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    table = page[page.index("## Environment variables"):]
    listed = set(re.findall(r"`(LIGHTNING_FULLGRAPH_[A-Z_]+)`", table))
    assert "LIGHTNING_FULLGRAPH_CACHE" in read and len(read) >= 10
    assert read == listed, (sorted(read - listed), sorted(listed - read))
