"""One rank of the context-parallel suite: ``python ranks.py RANK WORLD STORE_FILE OUT_PREFIX [FILTER] [-v]``.

The WORLD processes run every case twice: on all of them, then on the group of the first WORLD − 1 (when that is
at least 2): one start of the processes (the slow part on a CI machine) for two group sizes.

Every case builds the same float64 inputs on every rank (one seed per case), runs one process's computation on
the whole sequence (the reference), runs the context-parallel computation on this rank's shard with a gloo group,
and measures, as a relative error ``max|got − want| / max(1, max|want|)``:

- the outputs: this shard's rows of the reference's;
- the gradients (a random cotangent, the same on every rank): of every per-token input, this shard's rows; of
  every whole-sequence input (parameters, initial states), the sum over the ranks;
- final states: the state after this shard's last token equals the reference's on the prefix ending there.

It writes ``{group size: {case: {check: error}}}`` (``{"error": traceback}`` for a case that raised) to
``OUT_PREFIX.RANK.json``; the tests
(``test_*.py`` beside it) read them. Cases are registered by ``@case``; their names say what they cover.
"""
from __future__ import annotations

import datetime
import json
import sys
import traceback

import torch
import torch.distributed as dist

import cases_kernels  # noqa: F401  (registers the op cases)
import cases_layers  # noqa: F401  (registers the mixer and model cases)
from common import CASES


def run_cases(group, only: str, verbose: bool) -> dict:
    results = {}
    for name, fn in CASES.items():
        if only not in name:
            continue
        if verbose:
            print(f"rank {dist.get_rank()}/{dist.get_world_size(group)}: {name}", flush=True)
        try:
            results[name] = {k: float(v) for k, v in fn(group).items()}
        except Exception:  # noqa: BLE001 — reported per case; the peers hit the gloo timeout if a collective hangs
            results[name] = {"error": traceback.format_exc(limit=8)}
        dist.barrier(group=group)
    return results


def main(argv: list[str]) -> None:
    rank, world, store_file, out_prefix = int(argv[0]), int(argv[1]), argv[2], argv[3]
    torch.set_num_threads(1)
    store = dist.FileStore(store_file, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    only = argv[4] if len(argv) > 4 else ""  # a substring: run only the cases whose name holds it (debugging)
    results = {}
    for size in sorted({world, world - 1} - {0, 1}, reverse=True):
        group = dist.group.WORLD if size == world else dist.new_group(list(range(size)))  # every rank calls it
        if rank < size:
            results[size] = run_cases(group, only, verbose="-v" in argv)
        dist.barrier()
    with open(f"{out_prefix}.{rank}.json", "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
