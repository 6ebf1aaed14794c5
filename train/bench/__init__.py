"""``hybrid-bench`` (``python -m hybrid.train.cli.bench``, its command line ``hybrid.train.cli.bench``): the suites trained on equal budgets and reported
(``suites``, ``budgets``, ``harness``, ``quality``, ``cost``, ``report``); and benchmarks that print tables:
``scan`` (complex_scan on CPU), ``scan_gpu`` (Triton on CUDA), ``speed`` (models), ``long_context``.

    hybrid-bench --suite all --budget smoke --out runs/smoke
    python -m hybrid.train.bench.scan
    python -m hybrid.train.bench.speed
"""
