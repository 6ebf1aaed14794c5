"""No op or mixer copies host values to the device in a way that waits for the stream.

``torch.tensor(values, device=…)`` (and ``as_tensor`` of host values) copies and then synchronises the stream: on a
GPU, a host sync each call, once per layer in a training step. The ops and mixers make such tensors with
``varlen.on_device`` (a non-blocking copy), a kernel (``arange``, ``full``) or keep them on the host. A GPU counts
the syncs (``gpu_check``'s correctness part, tests/cuda/test_model_cuda.py); this test keeps the pattern from
coming back between GPU sessions. The references, which tests run on the CPU, are exempt."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKING = re.compile(r"torch\.(tensor|as_tensor)\((?:[^()]|\([^()]*\))*device=")
EXEMPT = {"reference.py"}  # the plain references: never the fast path


def sources():
    for folder in ("kernels", "hybrid"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name not in EXEMPT:
                yield path


def test_the_ops_and_mixers_copy_host_values_without_a_stream_sync():
    found = []
    for path in sources():
        code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())  # comments aside
        code = re.sub(r'"""(?:.|\n)*?"""', "", code)  # docstrings aside (they name the pattern)
        found += [f"{path.relative_to(ROOT)}: {m.group(0)[:80]}" for m in BLOCKING.finditer(code)]
    assert not found, "copies that wait for the stream (use hybrid.kernels.varlen.on_device):\n" + "\n".join(found)


def test_the_pattern_is_found():
    """The pattern matches the forms it must catch, and not the non-blocking ones."""
    for bad in ("torch.tensor([0, T], device=q.device)", "torch.as_tensor(c, dtype=torch.float64, device=d)",
                "torch.tensor(list(x), dtype=torch.long, device=dev)"):
        assert BLOCKING.search(bad), bad
    for good in ("torch.tensor(values, dtype=dtype).to(device, non_blocking=True)", "torch.full((), 1.0, device=d)",
                 "torch.arange(0, T + 1, T, device=device)"):
        assert not BLOCKING.search(good), good
