"""Sphinx configuration of the lightning-fullgraph documentation.

Build: ``python -m sphinx -W -b html docs docs/_build/html`` (CI builds it in
``tests/test_docs.py``, warnings as errors).
"""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))  # the checkout's package, also when not installed
sys.path.insert(0, os.path.abspath("_ext"))  # benchmark_tables: the `benchmark-table` directive

project = "lightning-fullgraph"
author = "lightning-fullgraph developers"
extensions = [
    "myst_parser",            # the pages are Markdown
    "sphinx.ext.autodoc",     # the API reference, from the docstrings
    "sphinx.ext.napoleon",    # their Args:/Shapes:/Returns: sections
    "sphinx.ext.viewcode",
    "benchmark_tables",       # measurements rendered from benchmarks/results.json
]
# The curated measurements (relative to the repository root; `-D benchmark_results=PATH` for
# another file).
benchmark_results = "benchmarks/results.json"
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_heading_anchors = 4      # links to sections (page.md#a-section) resolve
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_custom_sections = [("Shapes", "params_style")]
html_theme = "alabaster"
html_static_path = ["_static"]
# Options such as --layers stay as typed (the benchmark set-ups are plain text, not literals).
smartquotes = False
