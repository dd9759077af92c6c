"""The benchmark suite of lightning-fullgraph (not part of the installed library).

Run a topic with ``python -m benchmarks <topic> [options]`` from the repository root;
``python -m benchmarks --help`` lists the topics, ``python -m benchmarks <topic> --help`` its
options.  Every topic writes its result file to ``--out DIR``, ``$LIGHTNING_FULLGRAPH_BENCH_DIR``
or ``~/.cache/lightning_fullgraph/benchmarks/``; ``python -m benchmarks curate`` turns result files
into entries of the committed ``benchmarks/results.json`` (the numbers the documentation cites),
``python -m benchmarks plot`` draws a topic's figure from one.

Nothing here imports torch at package level: the ``fullgraph`` and ``aggregation`` topics spawn
processes that measure their memory before importing it.
"""
