"""Test-wide setup.

Without a GPU, every Triton kernel runs under Triton's CPU interpreter. The variable must be set before
any module that defines a kernel is imported, hence here, before test collection.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
