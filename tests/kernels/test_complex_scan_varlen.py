"""complex_scan over packed sequences (``cu_seqlens``), and the scan under torch.compile.

"Packed equals separate": a packed call's outputs, final states and gradients (w.r.t. x, log_decay, theta and
the per-sequence initial states, through a loss on both y and the final states) equal each sequence run alone
through the float64 sequential reference. Boundaries sit at, one before and one after the torch backend's block
edges (block_size=8 here) and the Triton interpreter's fixed time tile (8 steps, ``triton_scan.default_blocks``),
beside documents of length 1 and 2. The Triton backend runs under the interpreter (tests/conftest.py): tiny sizes.
"""
from __future__ import annotations

import itertools
import math
import os

import pytest
import torch

from hybrid.kernels import complex_scan, complex_scan_reference
from hybrid.kernels.complex_scan import cpu_scan
from hybrid.kernels.complex_scan.interface import triton_available
from hybrid.kernels.complex_scan.triton_scan import scan_layout

EDGE = 8  # the torch backend's block_size in these tests, and the interpreter's Triton time tile
_seed = itertools.count(2718)


def gen() -> torch.Generator:
    return torch.Generator().manual_seed(next(_seed))


def backends():
    return [
        "torch",
        "reference",
        pytest.param("cpu", marks=pytest.mark.skipif(not cpu_scan.available(), reason="no C++ compiler")),
        pytest.param("triton", marks=_NEEDS_TRITON),
        pytest.param("triton-runs", marks=_NEEDS_TRITON),  # the Triton scan's runs layout (R steps per thread)
    ]


_NEEDS_TRITON = pytest.mark.skipif(
    not triton_available() or (not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="no triton")


def options(backend: str) -> dict:
    return {"backend": "triton" if backend == "triton-runs" else backend,
            "block_size": EDGE if backend == "torch" else None}


def device_of(backend: str) -> torch.device:
    """Where a backend runs: Triton on the GPU when there is one (else the interpreter), the rest on the CPU."""
    return torch.device("cuda" if backend.startswith("triton") and torch.cuda.is_available() else "cpu")


def scan(backend, x, ld, th, s0, cu, **kw):
    """``complex_scan`` with the backend's options on its device; results (and gradients) back on the CPU."""
    dev = device_of(backend)
    on = lambda t: None if t is None else t.to(dev)  # noqa: E731
    with scan_layout("runs" if backend == "triton-runs" else "tile"):  # (the backward follows the forward's)
        y, final = complex_scan(on(x), on(ld), on(th), on(s0), cu_seqlens=on(cu), **options(backend), **kw)
    return y.cpu(), None if final is None else final.cpu()


def dtype_of(backend: str) -> torch.dtype:
    """float64 where the backend computes in it; the Triton kernels compute in float32."""
    return torch.float32 if backend.startswith("triton") else torch.float64


def tolerance(dtype: torch.dtype) -> float:
    return 1e-12 if dtype == torch.float64 else 1e-5


def offsets(T: int, *, edges: bool = True) -> torch.Tensor:
    """cu_seqlens for T tokens: documents of length 1 and 2 first, cuts at / before / after block and tile
    edges, a few random cuts, and one longer document spanning several edges."""
    g = gen()
    cuts = {1, 3}
    if edges:
        cuts |= {EDGE - 1, EDGE, EDGE + 1, 2 * EDGE - 1, 3 * EDGE, 3 * EDGE + 1}
    long_doc = range(T - 2 * EDGE - 3, T - 1)  # left uncut: a document crossing two edges
    extra = torch.randint(1, T, (4,), generator=g).tolist()
    cuts |= {c for c in extra if c not in long_doc}
    return torch.tensor([0] + sorted(c for c in cuts if 0 < c < T) + [T])


def make(T, H, D, cu, *, decay: str, init: bool, dtype=torch.float64):
    """Leaves (x, log_decay, theta, initial_state or None) and upstream gradients (for y and the final states).
    decay: 'static' ((H, P) each), 'dependent' ((1, T, H, P) each) or 'mixed' (static decay, dependent angle)."""
    g = gen()
    P, N = D // 2, cu.numel() - 1
    dep = (1, T, H, P)
    ld_shape = dep if decay == "dependent" else (H, P)
    th_shape = (H, P) if decay == "static" else dep
    x = torch.randn(1, T, H, D, generator=g, dtype=torch.float64)
    ld = -(0.02 + 0.8 * torch.rand(ld_shape, generator=g, dtype=torch.float64))
    th = math.pi * (2 * torch.rand(th_shape, generator=g, dtype=torch.float64) - 1)
    s0 = torch.randn(N, H, D, generator=g, dtype=torch.float64) if init else None
    ups = (torch.randn(1, T, H, D, generator=g, dtype=torch.float64),
           torch.randn(N, H, D, generator=g, dtype=torch.float64))
    leaves = [None if t is None else t.to(dtype) for t in (x, ld, th, s0)]
    return leaves, ups


def time_part(t: torch.Tensor, s: int, e: int) -> torch.Tensor:
    return t[:, s:e] if t.dim() == 4 and t.shape[1] > 1 else t


def separate(x, ld, th, s0, cu):
    """Each sequence alone through the sequential reference; outputs concatenated, final states stacked."""
    b = cu.tolist()
    ys, finals = [], []
    for n in range(len(b) - 1):
        s, e = b[n], b[n + 1]
        y, f = complex_scan_reference(x[:, s:e], time_part(ld, s, e), time_part(th, s, e),
                                      None if s0 is None else s0[n:n + 1], output_final_state=True)
        ys.append(y)
        finals.append(f)
    return torch.cat(ys, 1), torch.cat(finals, 0)


def run(fn, leaves, ups, dtype):
    """(y, final, *grads of the leaves that are not None) of ``fn`` on copies of the leaves in ``dtype``."""
    ts = [None if t is None else t.detach().to(dtype).requires_grad_() for t in leaves]
    y, final = fn(*ts)
    wrt = [t for t in ts if t is not None]
    loss = (y * ups[0].to(y.dtype)).sum() + (final * ups[1].to(final.dtype)).sum()
    return (y, final, *torch.autograd.grad(loss, wrt))


NAMES = ("y", "final", "grad x", "grad log_decay", "grad theta", "grad initial_state")


def relative_error(got, want) -> float:
    got, want = got.detach().double(), want.detach().double()
    scale = want.abs().max().item()
    return (got - want).abs().max().item() / (scale if scale else 1.0)


def assert_matches(ours, ref, tol, what=""):
    for name, got, want in zip(NAMES, ours, ref):
        assert got.shape == want.shape, f"{what} {name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
        assert torch.isfinite(got).all(), f"{what} {name}: non-finite values"
        err = relative_error(got, want)
        assert err < tol, f"{what} {name}: relative error {err:.2e}"


def packed(backend, cu, **kw):
    return lambda x, ld, th, s0: scan(backend, x, ld, th, s0, cu, output_final_state=True, **kw)


# ---------------------------------------------------------------------------------------------- packed = separate


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("decay", ["static", "dependent", "mixed"])
@pytest.mark.parametrize("init", [False, True], ids=["zero0", "init"])
def test_packed_equals_separate(backend, decay, init, one_torch_thread):
    T, H, D = (45, 2, 6) if backend.startswith("triton") else (61, 3, 10)
    if backend.startswith("triton") and os.environ.get("TRITON_INTERPRET") == "1":  # the edges are the tile's
        from hybrid.kernels.complex_scan.triton_scan import default_blocks
        assert default_blocks(T, D // 2)[0] == EDGE
    cu = offsets(T)
    dtype = dtype_of(backend)
    leaves, ups = make(T, H, D, cu, decay=decay, init=init, dtype=dtype)
    ours = run(packed(backend, cu), leaves, ups, dtype)
    ref = run(lambda *a: separate(*a, cu), leaves, ups, torch.float64)
    assert ours[0].dtype == dtype and ours[1].dtype == dtype
    assert_matches(ours, ref, tolerance(dtype), f"{backend} cu_seqlens={cu.tolist()}")


def windows(rows: int, L: int) -> list[int]:
    """Offsets of ``rows`` windows of ``L`` tokens packed by documents: every window start, plus documents of one
    and two tokens and cuts at the interpreter's tile edge inside them (windows one token longer than the tile,
    so that the windows' own edges fall off every tile edge)."""
    g = gen()
    bounds = set()
    for r in range(rows):
        inside = {1, 3, EDGE, *torch.randint(1, L, (2,), generator=g).tolist()} if r % 2 else {L - 1}
        bounds |= {r * L} | {r * L + c for c in inside if 0 < c < L}
    return sorted(bounds) + [rows * L]


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("decay", ["static", "dependent", "mixed"])
def test_windows_packed_by_documents_run_as_rows_side_by_side(backend, decay, monkeypatch, one_torch_thread):
    """A ``PackedOffsets`` of windows packed by documents knows its window length (``row_len``), and the scan runs
    the packed row as one row per window: the rows the kernel sees, and every output, final state and gradient
    as each sequence run alone."""
    from hybrid.kernels.complex_scan import interface
    from hybrid.kernels.varlen import PackedOffsets

    rows, L = (3, EDGE + 1) if backend.startswith("triton") else (4, 2 * EDGE + 1)
    H, D = (2, 6) if backend.startswith("triton") else (3, 10)
    bounds = windows(rows, L)
    cu = torch.tensor(bounds)
    dtype = dtype_of(backend)
    leaves, ups = make(rows * L, H, D, cu, decay=decay, init=True, dtype=dtype)
    seen = []
    real_scan = interface._scan
    monkeypatch.setattr(interface, "_scan", lambda x, *a: seen.append(tuple(x.shape)) or real_scan(x, *a))

    def side_by_side(x, ld, th, s0):
        dev = device_of(backend)
        offsets = PackedOffsets.from_bounds(bounds, device=dev)
        assert offsets.row_len == L
        on = lambda t: None if t is None else t.to(dev)  # noqa: E731
        with scan_layout("runs" if backend == "triton-runs" else "tile"):
            y, final = complex_scan(on(x), on(ld), on(th), on(s0), cu_seqlens=offsets, output_final_state=True,
                                    **options(backend))
        return y.cpu(), final.cpu()

    ours = run(side_by_side, leaves, ups, dtype)
    ref = run(lambda *a: separate(*a, cu), leaves, ups, torch.float64)
    assert_matches(ours, ref, tolerance(dtype), f"{backend} windows {bounds}")
    if backend != "reference":  # (the reference runs each sequence alone, never the rows)
        assert seen == [(rows, L, H, D)]


def test_offsets_know_the_rows_their_every_multiple_starts():
    from hybrid.kernels.varlen import PackedOffsets, aligned_row_length, packed_offsets

    assert aligned_row_length(windows(4, 17)) == 17
    assert aligned_row_length([0, 4, 8, 12, 14, 16]) == 4  # shorter than the windows when each breaks alike
    assert aligned_row_length([0, 5, 8, 12, 16]) == 8
    assert aligned_row_length([0, 3, 29]) == 29  # one row: nothing to split
    assert aligned_row_length([0, 4, 8, 12, 16], 8) == 8 and aligned_row_length([0, 4, 9, 16], 8) is None
    assert packed_offsets(torch.tensor([0, 2, 6, 8, 12]), 12, "cpu").row_len == 6
    checked = PackedOffsets.from_bounds([0, 2, 6, 8, 12], device="cpu")
    assert checked.row_len == 6 and checked.without_host_values(checked.cu_seqlens).row_len == 6
    with pytest.raises(ValueError, match=r"^row_len: expected a length whose every multiple is a sequence start "
                                         r"of a packed batch of 12 tokens, got 4$"):
        PackedOffsets(checked.cu_seqlens, checked.bounds, checked.max_len, 4)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_int32_offsets_and_no_final_state(backend, one_torch_thread):
    if backend == "cpu" and not cpu_scan.available():
        pytest.skip("no C++ compiler")
    T, H, D = 30, 2, 4
    cu = offsets(T)
    (x, ld, th, s0), _ = make(T, H, D, cu, decay="dependent", init=True)
    y64, f64 = complex_scan(x, ld, th, s0, cu_seqlens=cu, output_final_state=True, **options(backend))
    y32, f32 = complex_scan(x, ld, th, s0, cu_seqlens=cu.int(), output_final_state=True, **options(backend))
    assert torch.equal(y64, y32) and torch.equal(f64, f32)
    y, final = complex_scan(x, ld, th, s0, cu_seqlens=cu, **options(backend))
    assert final is None and torch.equal(y, y64)
    _, final = complex_scan(x, ld, th, s0[:1], **options(backend))  # without cu_seqlens too: None by default
    assert final is None


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_keep_float32_final_states(backend, dtype, one_torch_thread):
    """The final states come from float32 states (as without cu_seqlens), not from y rounded to x's dtype."""
    if backend == "cpu" and not cpu_scan.available():
        pytest.skip("no C++ compiler")
    T, H, D = 40, 2, 6
    cu = offsets(T)
    leaves, ups = make(T, H, D, cu, decay="dependent", init=True)
    x = leaves[0].to(dtype)
    rest = [t.float() for t in leaves[1:]]
    ours = run(lambda a, *r: packed(backend, cu)(a.to(dtype), *r), [x.float(), *rest], ups, torch.float32)
    ref = run(lambda *a: separate(*a, cu), [x.double(), *(t.double() for t in rest)], ups, torch.float64)
    assert ours[0].dtype == dtype and ours[1].dtype == torch.float32
    unit = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    assert relative_error(ours[0], ref[0]) < 2 * unit, "y"  # rounded once to x's dtype
    for name, got, want in list(zip(NAMES, ours, ref))[1:]:
        tol = 1e-5 if name == "final" else 4 * unit  # the upstream gradient of y is in x's dtype
        assert relative_error(got, want) < tol, name


# ---------------------------------------------------------------------------------------------- restarts are exact


def _doc_slices(cu):
    b = cu.tolist()
    return [slice(b[n], b[n + 1]) for n in range(len(b) - 1)]


@pytest.mark.parametrize("backend", backends())
def test_other_documents_contribute_exactly_nothing(backend, one_torch_thread):
    """Changing every value of one document (inputs, decays, angles, initial state, upstream gradients) leaves
    every other document's outputs, final states and gradients bitwise unchanged: the restart multiplies the
    previous state by exactly 0, forward and backward."""
    T, H, D = (27, 2, 6) if backend.startswith("triton") else (40, 3, 6)
    cu = torch.tensor([0, 2, EDGE + 1, 2 * EDGE, T])  # the changed document crosses an edge
    dtype = dtype_of(backend)
    leaves, ups = make(T, H, D, cu, decay="dependent", init=True, dtype=dtype)
    victim = _doc_slices(cu)[1]
    g = gen()
    changed = [t.clone() for t in leaves]
    changed[0][:, victim] = 100 * torch.randn(changed[0][:, victim].shape, generator=g, dtype=torch.float64).to(dtype)
    changed[1][:, victim] = 0.0  # γ = 1
    changed[2][:, victim] = 1e4 * torch.randn(changed[2][:, victim].shape, generator=g, dtype=torch.float64).to(dtype)
    changed[3][1] = 1e3
    ups_changed = (ups[0].clone(), ups[1].clone())
    ups_changed[0][:, victim] = 7.0
    ups_changed[1][1] = -3.0
    a = run(packed(backend, cu), leaves, ups, dtype)
    b = run(packed(backend, cu), changed, ups_changed, dtype)
    for name, ga, gb in zip(NAMES, a, b):
        for n, s in enumerate(_doc_slices(cu)):
            if n == 1:
                continue
            if name in ("final", "grad initial_state"):
                assert torch.equal(ga[n], gb[n]), f"{name} of document {n}"
            else:
                assert torch.equal(ga[:, s], gb[:, s]), f"{name} of document {n}"


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")  # the interpreter, 1e30 rad
@pytest.mark.parametrize("backend", backends())
def test_padding_document_never_touches_real_ones(backend, one_torch_thread):
    """A run of padding tokens packed as its own document, with wild gates (γ = 1, angles up to 1e30, huge
    inputs), changes no real document's outputs or gradients (fla #1272), which equal each run alone."""
    H, D = 2, 6
    real_a, pad, real_b = (11, 6, 13) if backend.startswith("triton") else (19, 9, 23)
    T = real_a + pad + real_b
    cu = torch.tensor([0, real_a, real_a + pad, T])
    dtype = dtype_of(backend)
    leaves, ups = make(T, H, D, cu, decay="dependent", init=True, dtype=dtype)
    g = gen()
    p = slice(real_a, real_a + pad)
    wild = [t.clone() for t in leaves]
    wild[0][:, p] = 1e6 * torch.randn(wild[0][:, p].shape, generator=g, dtype=torch.float64).to(dtype)
    wild[1][:, p] = 0.0
    angles = torch.tensor([1e30, -1e30, 3e8, 1e5, 8193.0, -2.5e7], dtype=torch.float64)
    wild[2][:, p] = angles[torch.randint(0, 6, wild[2][:, p].shape, generator=g)].to(dtype)
    plain = run(packed(backend, cu), leaves, ups, dtype)
    ours = run(packed(backend, cu), wild, ups, dtype)
    for name, got, want in zip(NAMES, ours, plain):
        if name in ("final", "grad initial_state"):
            got, want = got[[0, 2]], want[[0, 2]]
        else:
            got = torch.cat([got[:, :real_a], got[:, real_a + pad:]], 1)
            want = torch.cat([want[:, :real_a], want[:, real_a + pad:]], 1)
        assert torch.isfinite(got).all() and torch.equal(got, want), name
    # and the real documents are exactly what they are alone (the padding removed altogether)
    keep = torch.cat([torch.arange(real_a), torch.arange(real_a + pad, T)])
    alone_cu = torch.tensor([0, real_a, real_a + real_b])
    alone = [t[:, keep] if t.dim() == 4 else t[[0, 2]] for t in leaves]
    ref = run(lambda *a: separate(*a, alone_cu), alone, (ups[0][:, keep], ups[1][[0, 2]]), torch.float64)
    ours_real = [t[:, keep] if t.dim() == 4 else t[[0, 2]] for t in ours]
    assert_matches(ours_real, ref, tolerance(dtype), backend)


# ---------------------------------------------------------------------------------------------- continuation


@pytest.mark.parametrize("backend", ["torch", "reference", "cpu"])
def test_single_sequence_split_anywhere(backend, one_torch_thread):
    """One sequence in two calls, the first's final state the second's initial state, equals one call, for
    every split point in a range around a block edge."""
    if backend == "cpu" and not cpu_scan.available():
        pytest.skip("no C++ compiler")
    T, H, D = 29, 2, 6
    cu = torch.tensor([0, T])
    (x, ld, th, s0), _ = make(T, H, D, cu, decay="dependent", init=True)
    y, final = complex_scan(x, ld, th, s0, cu_seqlens=cu, output_final_state=True, **options(backend))
    for split in range(EDGE - 2, 2 * EDGE + 3):
        y_a, f_a = complex_scan(x[:, :split], ld[:, :split], th[:, :split], s0, output_final_state=True,
                                cu_seqlens=torch.tensor([0, split]), **options(backend))
        y_b, f_b = complex_scan(x[:, split:], ld[:, split:], th[:, split:], f_a, output_final_state=True,
                                cu_seqlens=torch.tensor([0, T - split]), **options(backend))
        assert relative_error(torch.cat([y_a, y_b], 1), y) < 1e-12, f"y, split {split}"
        assert relative_error(f_b, final) < 1e-12, f"final, split {split}"


def _split_call(backend, x, ld, th, s0, cu, tau):
    """The packed batch in two calls split at time ``tau``; the document crossing it carries its state over.
    Returns y and the final states of all documents."""
    b = cu.tolist()
    N = len(b) - 1
    crossing = next(n for n in range(N) if b[n] < tau <= b[n + 1])  # the last document of the first call
    cu_a = torch.tensor(b[: crossing + 1] + [tau])
    rest = [e - tau for e in b[crossing + 1:]]
    continues = tau < b[crossing + 1]
    cu_b = torch.tensor(([0] if continues else []) + rest)
    y_a, f_a = scan(backend, x[:, :tau], time_part(ld, 0, tau), time_part(th, 0, tau), s0[: crossing + 1], cu_a,
                    output_final_state=True)
    s0_b = torch.cat([f_a[crossing:], s0[crossing + 1:]]) if continues else s0[crossing + 1:]
    y_b, f_b = scan(backend, x[:, tau:], time_part(ld, tau, b[-1]), time_part(th, tau, b[-1]), s0_b, cu_b,
                    output_final_state=True)
    finals = torch.cat([f_a[:crossing], f_b]) if continues else torch.cat([f_a, f_b])
    return torch.cat([y_a, y_b], 1), finals


@pytest.mark.parametrize("backend", backends())
def test_packed_batch_split_in_two_calls(backend, one_torch_thread):
    T, H, D = (30, 2, 4) if backend.startswith("triton") else (41, 2, 6)
    cu = offsets(T)
    dtype = dtype_of(backend)
    (x, ld, th, s0), _ = make(T, H, D, cu, decay="dependent", init=True, dtype=dtype)
    y, final = scan(backend, x, ld, th, s0, cu, output_final_state=True)
    taus = [1, 3, EDGE, EDGE + 1, T - 5] if backend.startswith("triton") else range(1, T)
    for tau in taus:
        y2, final2 = _split_call(backend, x, ld, th, s0, cu, tau)
        assert relative_error(y2, y) < tolerance(dtype), f"y, split at {tau}"
        assert relative_error(final2, final) < tolerance(dtype), f"final states, split at {tau}"


# ---------------------------------------------------------------------------------------------- bad arguments


def _bad_cases():
    """(x, cu_seqlens, a fragment of the message). The check is the shared one of every op (kernels/varlen.py)."""
    x = torch.randn(1, 5, 2, 4)
    return [
        (x, [0, 5], "got list"),  # not a tensor
        (x, torch.tensor([[0, 5]]), "1-D"),
        (x, torch.tensor([], dtype=torch.int64), "got shape (0,)"),
        (x, torch.tensor([0.0, 5.0]), "int64"),  # not an integer dtype
        (x, torch.tensor([0, 5], dtype=torch.int16), "int64"),
        (x, torch.tensor([0, 5], device="meta"), "meta"),  # another device than x's
        (x, torch.tensor([1, 5]), "got 1"),  # does not start at 0
        (x, torch.tensor([0, 3, 3, 5]), "strictly increasing"),  # an empty sequence
        (x, torch.tensor([0, 4, 2, 5]), "strictly increasing"),
        (x, torch.tensor([0, 3]), "total_T"),  # does not end at total_T = 5
        (x, torch.tensor([0, 3, 6]), "got 6"),
        (torch.randn(2, 5, 2, 4), torch.tensor([0, 5]), "batch"),  # not one packed row
    ]


@pytest.mark.parametrize("case", range(len(_bad_cases())))
def test_bad_cu_seqlens(case):
    x, cu, expected = _bad_cases()[case]
    with pytest.raises(ValueError) as err:
        complex_scan(x, -torch.rand(2, 2), torch.rand(2, 2), cu_seqlens=cu, backend="torch")
    message = str(err.value)
    assert "\n" not in message and message.startswith("cu_seqlens: expected") and expected in message, message


def test_initial_state_must_be_one_per_sequence():
    x = torch.randn(1, 5, 2, 4)
    cu = torch.tensor([0, 2, 5])
    with pytest.raises(ValueError) as err:
        complex_scan(x, -torch.rand(2, 2), torch.rand(2, 2), torch.zeros(1, 2, 4), cu_seqlens=cu)
    message = str(err.value)
    assert "\n" not in message and message.startswith("initial_state: expected shape (N, H, D)")
    assert "cu_seqlens" in message and "= (2, 2, 4), got (1, 2, 4)" in message


# ---------------------------------------------------------------------------------------------- torch.compile


def _compile_case(T=23, H=2, D=6, dtype=torch.float64):
    cu = torch.tensor([0, 1, 3, EDGE, EDGE + 1, T])
    leaves, ups = make(T, H, D, cu, decay="mixed", init=True, dtype=dtype)
    return cu, leaves, ups


def _scan_fn(backend, packed_call):
    def fn(x, ld, th, s0, cu):
        if packed_call:
            return complex_scan(x, ld, th, s0, output_final_state=True, cu_seqlens=cu, **options(backend))
        return complex_scan(x.reshape(3, -1, *x.shape[2:]), ld, th, s0[:3], output_final_state=True,
                            **options(backend))
    return fn


def _compiled_equals_eager(backend, compiler, packed_call, dtype, tol):
    T = 24 if not packed_call else 23
    cu, leaves, ups = _compile_case(T=T, dtype=dtype)
    fn = _scan_fn(backend, packed_call)
    if not packed_call:  # three rows of 8 steps; final states of the three
        leaves = [leaves[0], leaves[1], leaves[2][:, : T // 3], leaves[3]]
        ups = (ups[0].reshape(3, T // 3, *ups[0].shape[2:]), ups[1][:3])
        cu = None
    torch._dynamo.reset()
    try:
        compiled = torch.compile(fn, fullgraph=True, backend=compiler)
        ours = run(lambda *a: compiled(*a, cu), leaves, ups, dtype)
    finally:
        torch._dynamo.reset()
    eager = run(lambda *a: fn(*a, cu), leaves, ups, dtype)
    assert_matches(ours, eager, tol, f"{compiler} vs eager")


def _compile_backends():
    return ["torch", pytest.param("cpu", marks=pytest.mark.skipif(not cpu_scan.available(), reason="no C++"))]


@pytest.mark.parametrize("backend", _compile_backends())
@pytest.mark.parametrize("compiler", ["eager", "aot_eager"])
@pytest.mark.parametrize("packed_call", [False, True], ids=["batch", "packed"])
def test_fullgraph_compile_equals_eager(backend, compiler, packed_call, one_torch_thread):
    """No graph break (fullgraph=True) through checks, backend choice, the restart construction and the custom
    op; aot_eager also traces the op's fake implementation and autograd formula (the backward op)."""
    _compiled_equals_eager(backend, compiler, packed_call, torch.float64, 1e-12)


def test_fullgraph_compile_inductor(one_torch_thread):
    """The default backend (inductor) on this CPU: about 40 s for a first compile on a cold cache."""
    backend = "cpu" if cpu_scan.available() else "torch"
    _compiled_equals_eager(backend, "inductor", True, torch.float32, 1e-5)


# ---------------------------------------------------------------------------------------------- the custom ops


@pytest.mark.parametrize("backend", _compile_backends())
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_opcheck(backend, dtype, one_torch_thread):
    g = gen()
    real = torch.float64 if dtype == torch.float64 else torch.float32
    B, T, H, D = 2, 7, 2, 6
    x = torch.randn(B, T, H, D, generator=g).to(dtype).requires_grad_()
    ld = (-torch.rand(B, T, H, D // 2, generator=g)).to(real).requires_grad_()
    th = torch.randn(1, 1, H, D // 2, generator=g).to(real).requires_grad_()
    s0 = torch.randn(B, H, D, generator=g).to(real).requires_grad_()
    forward = torch.ops.hybrid.complex_scan.default
    torch.library.opcheck(forward, (x, ld, th, s0, backend, 4, True))
    torch.library.opcheck(forward, (x, ld, th, None, backend, 4, True))
    torch.library.opcheck(forward, (x.detach(), ld.detach(), th.detach(), None, backend, 4, False))
    with torch.no_grad():
        y, final, residual, tile = forward(x, ld, th, s0, backend, 4, True)
    states = y if dtype == real else residual
    gy = torch.randn(y.shape, generator=g).to(dtype)
    gf = torch.randn(final.shape, generator=g).to(real)
    backward = torch.ops.hybrid.complex_scan_backward.default
    plain = [t.detach() for t in (ld, th, s0)]
    torch.library.opcheck(backward, (gy, gf, None, *plain, states, tile, dtype, backend, 4, [True] * 4))
    torch.library.opcheck(backward, (None, gf, None, plain[0], plain[1], None, states, tile, dtype, backend, 4,
                                     [False, True, False, False]))
