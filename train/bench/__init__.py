"""Benchmarks that print tables: ``scan`` (complex_scan on CPU), ``scan_gpu`` (Triton on CUDA), ``speed`` (models).

    python -m hybrid.train.bench.scan
    python -m hybrid.train.bench.speed
"""
