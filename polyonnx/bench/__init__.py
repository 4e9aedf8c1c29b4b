"""Performance history and dashboards over the perf/ suite.

``polyonnx bench`` runs the suite through pytest-benchmark and saves each run in a history
directory (suite.py, history.py); ``polyonnx dashboard`` writes a static site of that
history (site.py, svg.py), flagging the runs that change a benchmark's level beyond a
threshold and beyond the spread between runs (levels.py). ``polyonnx bench --compare``
gates one run against another by a threshold and a Mann–Whitney U test (compare.py,
stats.py).
"""
