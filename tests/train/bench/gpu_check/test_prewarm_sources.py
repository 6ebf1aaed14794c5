"""The committed prewarm (docs/research/gpu/prewarm_cache.tgz) was compiled from this checkout's scan kernels:
a kernel or its tiles changed without the prewarm run again would cost the next device session its compiles, and
nothing else would say so before then."""
from pathlib import Path

from hybrid.train.bench.gpu_check import prewarm_sources

REPO = Path(__file__).resolve().parents[4]


def test_the_committed_prewarm_compiled_these_kernels():
    recorded = prewarm_sources.json.loads((REPO / prewarm_sources.DEFAULT_FILE).read_text())["functions"]
    now = prewarm_sources.current()
    assert any(name.endswith(".runs_fwd_kernel") for name in now) and len(now) >= 10
    lines = prewarm_sources.changes(recorded, now)
    assert not lines, ("the scan's Triton kernels changed since the committed prewarm; run it again and commit "
                       "both files (docs/gpu.md, 'The scan's kernels compiled here'):\n" + "\n".join(lines))


def test_changes_name_each_function_that_differs():
    now = {"triton_runs.runs_fwd_kernel": {"key": "a"}, "triton_runs.RUNS_FWD_CONFIGS": {"key": "[(4, 8)]"},
           "triton_device.sincos": {"key": "c"}}
    recorded = {"triton_runs.runs_fwd_kernel": {"key": "b"}, "triton_runs.RUNS_FWD_CONFIGS": {"key": "[(8, 4)]"},
                "triton_scan.gone": {"key": "d"}}
    assert prewarm_sources.changes(recorded, now) == [
        "triton_device.sincos: new since the prewarm", "triton_scan.gone: gone since the prewarm",
        "triton_runs.runs_fwd_kernel: its source (or a function it calls) changed since the prewarm",
        "triton_runs.RUNS_FWD_CONFIGS: its tiles changed since the prewarm"]
    assert prewarm_sources.changes(now, now) == []
