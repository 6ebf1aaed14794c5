"""One command that validates and measures every CUDA path of the library, sized for one GPU session.

    python -m hybrid.train.bench.gpu_check --out DIR [--parts correctness,scan,...] [--budget S] [--dry-run]

Parts, each run in a child process with its own time limit (a hung or slow part is stopped and the next one
runs), each writing what it measured as it goes:

1. ``correctness``: the Triton scan against the float64 reference (fp32, bf16, fp16; T from 1 to 65,536; static
   and data-dependent decay; packed sequences with boundaries at tile edges; initial and final states), every
   window backend against the reference, the conv, ``torch.compile(fullgraph=True)`` of the hybrid, the host
   syncs of a training step.
2. ``tests``: ``pytest -m cuda`` (the CUDA-only tests), then the Triton, window and conv test files on the GPU.
3. ``scan``: the scan's speed (``triton.testing.do_bench``, median) against a device copy of the same bytes, the
   torch backend compiled, accelerated-scan's complex scan and fla's HGRN scans where installed.
4. ``models``: training tokens/s and peak memory of the hybrids, RetNet and vo-rnn against the Transformer on
   SDPA, bf16 autocast, eager and compiled, padded and packed, T = 2K … 32K.
5. ``decoding``: ms/token and state bytes after 4K, 16K and 64K prompts at batch 1 and 16: eager steps, steps
   replayed from a CUDA graph and compiled steps.
6. ``training``: a 300-step ``small`` hybrid run with bf16 and ``--compile`` through ``hybrid-train``: its loss
   curve, and recurrent against parallel greedy samples.

After each part, ``DIR`` holds ``report.md``, ``results.json``, the plots and the test log: at most 8 files,
so a killed run still returns what it measured. ``--dry-run`` runs every part on the CPU at tiny sizes (the
Triton kernels under ``TRITON_INTERPRET=1``); CI runs it so the command cannot rot between GPU sessions.
``python -m hybrid.train.bench.gpu_check.aot`` compiles every Triton kernel for the H100 without a GPU.
How to run it on a lent GPU: docs/gpu.md.
"""
