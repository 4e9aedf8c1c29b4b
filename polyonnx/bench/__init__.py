"""Performance history and dashboards over the perf/ suite.

``polyonnx bench`` runs the suite through pytest-benchmark and saves each run in a history
directory (suite.py, history.py); ``polyonnx dashboard`` writes a static site of that
history (site.py, svg.py), flagging regressions and improvements that are both beyond a
threshold and significant by a Mann–Whitney U test (compare.py, stats.py).
"""
