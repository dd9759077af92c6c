"""A Sphinx directive that renders one curated benchmark result from ``benchmarks/results.json``.

Usage in a page (MyST)::

    ```{benchmark-table} cluster-sage
    ```

or in reStructuredText ``.. benchmark-table:: cluster-sage``.  It renders the topic's title (as
a rubric), set-up paragraph, the command that measured it (a ``bash`` code block), the table and
the notes.  The file is ``benchmarks/results.json`` relative to the repository root (the
parent of ``docs/``); ``benchmark_results`` in ``conf.py`` names another one.  Its format::

    {"<topic>": {"title": str, "command": str, "measured": "YYYY-MM-DD", "setup": str,
                 "columns": [str, ...], "rows": [[value, ...], ...], "notes": str (optional)}}

A missing file, a missing topic or a malformed entry is a Sphinx warning (an error under
``-W``), never a silently empty section.
"""
import json
from pathlib import Path

from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

REQUIRED = ("title", "command", "setup", "columns", "rows")


def _results_path(app) -> Path:
    path = Path(app.config.benchmark_results)
    return path if path.is_absolute() else Path(app.confdir).parent / path


def _cell(value) -> str:
    """A cell as the curated file writes it: ``null`` is an empty cell, numbers as JSON has them
    (``92.0`` stays ``92.0``)."""
    return "" if value is None else str(value)


class BenchmarkTable(SphinxDirective):
    required_arguments = 1
    has_content = False

    def _warn(self, message):
        logger.warning(message, location=self.get_location())
        return []

    def run(self):
        topic = self.arguments[0]
        path = _results_path(self.env.app)
        self.env.note_dependency(str(path))
        try:
            results = json.loads(path.read_text())
        except FileNotFoundError:
            return self._warn(f"benchmark-table: the results file {path} does not exist")
        except (OSError, ValueError) as e:
            return self._warn(f"benchmark-table: cannot read {path}: {e}")
        if not isinstance(results, dict) or topic not in results:
            known = ", ".join(sorted(results)) if isinstance(results, dict) else "none"
            return self._warn(f"benchmark-table: no topic {topic!r} in {path} (topics: {known})")
        entry = results[topic]
        missing = [k for k in REQUIRED if k not in entry]
        if missing:
            return self._warn(f"benchmark-table: topic {topic!r} in {path} lacks {missing}")
        columns, rows = entry["columns"], entry["rows"]
        bad = [i for i, row in enumerate(rows) if len(row) != len(columns)]
        if bad:
            return self._warn(f"benchmark-table: topic {topic!r}: rows {bad} do not have "
                              f"{len(columns)} cells")

        out = [nodes.rubric(text=entry["title"])]
        setup = entry["setup"]
        if entry.get("measured"):
            setup = f"{setup} Measured {entry['measured']}."
        out.append(nodes.paragraph(text=setup))
        command = nodes.literal_block(entry["command"], entry["command"])
        command["language"] = "bash"
        out.append(command)

        table = nodes.table(classes=["benchmark-table"])
        group = nodes.tgroup(cols=len(columns))
        table += group
        for _ in columns:
            group += nodes.colspec(colwidth=1)
        head = nodes.thead()
        group += head
        body = nodes.tbody()
        group += body
        for target, cells in ((head, [columns]), (body, rows)):
            for row in cells:
                tr = nodes.row()
                for value in row:
                    entry_node = nodes.entry()
                    entry_node += nodes.paragraph(text=_cell(value))
                    tr += entry_node
                target += tr
        out.append(table)
        if entry.get("notes"):
            out.append(nodes.paragraph(text=entry["notes"]))
        return out


def setup(app):
    app.add_config_value("benchmark_results", "benchmarks/results.json", "env")
    app.add_directive("benchmark-table", BenchmarkTable)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
