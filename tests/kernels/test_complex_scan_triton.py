"""The Triton backend of the complex scan against its own float64 sequential reference.

Without a GPU the kernels run under ``TRITON_INTERPRET=1`` (set by tests/conftest.py before this module
imports the kernel module), where every scan element costs a few hundred microseconds: sizes stay small.
With a GPU the same tests run the compiled kernels on CUDA copies of the inputs; the reference always runs
on the CPU in float64.

Tolerances. Float32 inputs are compared with ``max|err| <= RTOL * max|ref|`` per tensor (``RTOL = 1e-5``,
about 170 float32 unit roundoffs): each output is a decayed sum of products accumulated in float32 over
at most a few hundred effective steps (a tree scan inside a tile, a sequential carry across tiles), each
step adding a rounding of relative size 2^-24 of the running magnitude; with random signs those add like
a random walk, so ~1e-6 is typical and 1e-5 leaves margin without hiding a wrong index or a missing term.
Reduced gradients of broadcast (static) decay/angle sum ``B·T`` terms that may cancel, so their error is
measured against the sum of the terms' magnitudes (``Σ |term|``, computed in float64 by the reference)
instead of the possibly tiny result. Low-precision outputs get the one final rounding on top:
``|err| <= u·|ref| + RTOL·max|ref|`` with ``u`` the unit roundoff of the output dtype (2^-8 for bfloat16,
2^-11 for float16; 2^-7 for bfloat16 under the interpreter, whose float32 → bfloat16 cast truncates).
"""
import math
import os
import zlib

import pytest
import torch
import triton
import triton.language as tl

from hybrid.kernels.complex_scan import triton_scan
from hybrid.kernels.complex_scan import complex_scan
from hybrid.kernels.complex_scan.triton_scan import complex_decay, forced_blocks, scan_layout

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

RTOL = 1e-5
# Unit roundoff of the final store: round-to-nearest on a GPU; Triton's CPU interpreter truncates
# float32 → bfloat16 (one full ulp), and rounds float32 → float16 to nearest (numpy).
BF16_UNIT = 2.0 ** -7 if os.environ.get("TRITON_INTERPRET") == "1" else 2.0 ** -8
FP16_UNIT = 2.0 ** -11


# ----------------------------------------------------------------------------------------------------------
# The test's own reference: a float64 loop over time, complex128 arithmetic.
# ----------------------------------------------------------------------------------------------------------
def _to_complex(v):  # (..., D) interleaved real → (..., D/2) complex128
    v = v.to(torch.float64)
    return torch.complex(v[..., 0::2], v[..., 1::2])


def _to_real(c):  # (..., P) complex → (..., 2P) interleaved real
    return torch.view_as_real(c).flatten(-2)


def scan_reference(x, log_decay, theta, initial_state=None):
    """Sequential ``s_t = exp(log_decay_t − i·theta_t)·s_{t−1} + x_t`` in float64; differentiable."""
    B, T, H, D = x.shape
    P = D // 2
    xc = _to_complex(x)
    a = torch.exp(torch.complex(log_decay.to(torch.float64), -theta.to(torch.float64)))
    a = a.expand(B, T, H, P)
    s = (torch.zeros(B, H, P, dtype=torch.complex128) if initial_state is None
         else _to_complex(initial_state))
    ys = []
    for t in range(T):
        s = a[:, t] * s + xc[:, t]
        ys.append(s)
    return _to_real(torch.stack(ys, dim=1)), _to_real(s)


def reduced_grad_scale(x, log_decay, theta, initial_state, gy, gf, which):
    """Σ|term| of the broadcast-summed gradient of ``which`` ('ld' or 'th'), elementwise in its shape:
    the same reference computed with per-element (expanded) decay/angle, the magnitudes then summed."""
    B, T, H, D = x.shape
    P = D // 2
    ld = log_decay.detach().to(torch.float64).expand(B, T, H, P).clone().requires_grad_()
    th = theta.detach().to(torch.float64).expand(B, T, H, P).clone().requires_grad_()
    h0 = None if initial_state is None else initial_state.detach().to(torch.float64)
    y, f = scan_reference(x.detach().to(torch.float64), ld, th, h0)
    loss = (y * gy.to(torch.float64)).sum() + (f * gf.to(torch.float64)).sum()
    g = torch.autograd.grad(loss, ld if which == "ld" else th)[0].abs()
    target = log_decay if which == "ld" else theta
    dims = [i for i in range(4) if target.shape[i] == 1 and g.shape[i] != 1]
    return g.sum(dim=dims, keepdim=True) if dims else g


# ----------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------
@pytest.fixture(params=["tile", "runs"])
def layout(request):
    """The test runs once per layout of the kernels: "tile" (a time tile scanned across threads) and "runs"
    (``triton_runs``: runs of steps carried in each thread)."""
    with scan_layout(request.param):
        yield request.param


def scan(x, log_decay, theta, initial_state=None, _block_t=None, _block_p=None):
    """The Triton backend (the custom op's one autograd path) on DEVICE copies of the inputs, differentiable,
    results back on the CPU; ``_block_t`` / ``_block_p`` force its tiles (``forced_blocks``)."""
    def dev(t):
        return None if t is None else t.to(DEVICE)

    with forced_blocks(_block_t, _block_p):
        y, f = complex_scan(dev(x), dev(log_decay), dev(theta), dev(initial_state), output_final_state=True,
                            backend="triton", check_values=False)
    return y.cpu(), f.cpu()


def make_inputs(seed, B, T, H, D, ld_shape="dep", th_shape="dep", h0=True, dtype=torch.float32,
                ld_range=(-0.7, -0.01), th_scale=1.0):
    """Fresh random inputs. ``*_shape``: 'static' = (1, 1, H, P), 'dep' = (B, T, H, P), or a 4-tuple."""
    g = torch.Generator().manual_seed(seed)
    P = D // 2

    def shape_of(spec):
        return {"static": (1, 1, H, P), "dep": (B, T, H, P)}.get(spec, spec)

    x = torch.randn(B, T, H, D, generator=g).to(dtype)
    lo, hi = ld_range
    ld = lo + (hi - lo) * torch.rand(shape_of(ld_shape), generator=g)
    th = th_scale * torch.randn(shape_of(th_shape), generator=g)
    s0 = torch.randn(B, H, D, generator=g) if h0 else None
    return x, ld, th, s0


def seed_of(case):
    """A stable per-case seed (``hash`` of a str is randomised per process)."""
    return zlib.crc32(repr(case).encode()) % 100_000


def assert_scaled(actual, expected, rtol=RTOL, what=""):
    actual = actual.detach().to(torch.float64)
    expected = expected.detach().to(torch.float64)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    err = (actual - expected).abs().max().item()
    scale = expected.abs().max().item()
    assert err <= rtol * scale + 1e-30, f"{what}: max err {err:.3e} > {rtol:.1e} * scale {scale:.3e}"


def assert_lowp(actual, expected, unit, what=""):
    actual = actual.detach().to(torch.float64)
    expected = expected.detach().to(torch.float64)
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    bound = unit * expected.abs() + RTOL * expected.abs().max()
    excess = ((actual - expected).abs() - bound).max().item()
    assert excess <= 0, f"{what}: error exceeds the rounding bound by {excess:.3e}"


def grads_both(x, ld, th, s0, seed, use_y=True, use_final=True, **hooks):
    """Kernel gradients and float64-reference gradients for random upstream gradients of y and final."""
    g = torch.Generator().manual_seed(seed + 1000)
    leaves = [x.clone().requires_grad_(), ld.clone().requires_grad_(), th.clone().requires_grad_()]
    leaves.append(None if s0 is None else s0.clone().requires_grad_())
    y, f = scan(*leaves, **hooks)
    gy = torch.randn(y.shape, generator=g).to(y.dtype)
    gf = torch.randn(f.shape, generator=g)
    loss = 0.0
    if use_y:
        loss = loss + (y.float() * gy.float()).sum()
    if use_final:
        loss = loss + (f * gf).sum()
    wrt = [v for v in leaves if v is not None]
    got = torch.autograd.grad(loss, wrt)

    ref_leaves = [v.detach().to(torch.float64).requires_grad_() for v in wrt]
    ref_args = ref_leaves + ([None] if s0 is None else [])
    yr, fr = scan_reference(*ref_args)
    gy, gf = gy * use_y, gf * use_final
    ref_loss = (yr * gy.to(torch.float64)).sum() + (fr * gf.to(torch.float64)).sum()
    want = torch.autograd.grad(ref_loss, ref_leaves)
    return (y, f), (yr, fr), got, want, (gy, gf)


def check_grads(x, ld, th, s0, got, want, ups, rtol=RTOL):
    names = ["x", "log_decay", "theta", "initial_state"]
    for name, a, b in zip(names, got, want):
        assert a.shape == b.shape and a.dtype == (x.dtype if name == "x" else torch.float32), (name, a.dtype)
        reduced = name in ("log_decay", "theta") and a.shape != (x.shape[0], x.shape[1]) + a.shape[2:]
        if reduced:
            terms = reduced_grad_scale(x, ld, th, s0, ups[0], ups[1], "ld" if name == "log_decay" else "th")
            err = (a.to(torch.float64) - b).abs()
            assert torch.isfinite(a).all(), name
            assert (err <= rtol * terms + 1e-30).all(), f"{name}: {(err / terms).max().item():.3e} of Σ|term|"
        else:
            assert_scaled(a, b, rtol, name)


# ----------------------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------------------
FWD_CASES = [  # (B, T, H, D, ld, th, h0)
    (2, 1, 3, 6, "dep", "dep", True),
    (2, 7, 3, 6, "static", "static", False),
    (2, 7, 3, 6, "dep", "dep", True),
    (2, 63, 3, 6, "static", "dep", True),  # static decay, data-dependent angle
    (2, 63, 1, 6, "dep", "static", False),
    (1, 200, 3, 6, "dep", "dep", False),
    (2, 200, 1, 4, "static", "static", True),
    (3, 20, 1, 4, (1, 20, 1, 2), (3, 1, 1, 2), True),  # time-varying but batch-shared / per-batch static
]


@pytest.mark.parametrize("case", FWD_CASES, ids=lambda c: "B{}T{}H{}D{}-{}-{}-{}".format(*c))
def test_forward_matches_reference(case, layout):
    B, T, H, D, lds, ths, h0 = case
    x, ld, th, s0 = make_inputs(seed_of(case), B, T, H, D, lds, ths, h0)
    y, f = scan(x, ld, th, s0)
    yr, fr = scan_reference(x, ld, th, s0)
    assert y.dtype == x.dtype and f.dtype == torch.float32 and f.shape == (B, H, D)
    assert_scaled(y, yr, what="y")
    assert_scaled(f, fr, what="final")


@pytest.mark.parametrize("D", [2, 20, 128])
def test_head_dims(D, layout):
    # D=2: one pair; D=20: P=10 spans two pair blocks, the second partial; D=128: 8 blocks.
    B, T, H = 1, 9, 1
    x, ld, th, s0 = make_inputs(100 + D, B, T, H, D, "dep", "static", True)
    y, f = scan(x, ld, th, s0)
    yr, fr = scan_reference(x, ld, th, s0)
    assert_scaled(y, yr, what="y")
    assert_scaled(f, fr, what="final")


def test_long_sequence_with_gradients(layout):
    # 1031 steps: 129 time tiles carried in one launch, the last one partial.
    x, ld, th, s0 = make_inputs(7, 1, 1031, 1, 2, "dep", "dep", True, ld_range=(-0.05, 0.0))
    (y, f), (yr, fr), got, want, ups = grads_both(x, ld, th, s0, seed=7)
    assert_scaled(y, yr, 2 * RTOL, "y")
    assert_scaled(f, fr, 2 * RTOL, "final")
    check_grads(x, ld, th, s0, got, want, ups, rtol=2 * RTOL)


@pytest.mark.parametrize("block", [(4, 2), ((4, 8), 2), (16, 1)], ids=["BT4-BP2", "BT4:8-BP2", "BT16-BP1"])
def test_forced_block_sizes(block, layout):
    # Several tiles and pair blocks, partial last tile (T=7, T=13) and partial last pair block (P=3);
    # BT4:8 runs the backward on tiles twice the forward's (checkpoint interval) length.
    bt, bp = block
    seed = seed_of(block)
    x, ld, th, s0 = make_inputs(seed, 2, 13 if bt == (4, 8) else 7, 1, 6, "dep", "static", True)
    (y, f), (yr, fr), got, want, ups = grads_both(x, ld, th, s0, seed=seed, _block_t=bt, _block_p=bp)
    assert_scaled(y, yr, what="y")
    assert_scaled(f, fr, what="final")
    check_grads(x, ld, th, s0, got, want, ups)


def test_continuation(layout):
    B, T, H, D, split = 2, 45, 3, 6, 19
    for seed, (lds, ths) in enumerate([("dep", "dep"), ("static", "static")]):
        x, ld, th, s0 = make_inputs(20 + seed, B, T, H, D, lds, ths, True)
        part = (lambda v, sl: v[:, sl].contiguous() if v.shape[1] == T else v)
        y_full, f_full = scan(x, ld, th, s0)
        y_a, f_a = scan(part(x, slice(0, split)), part(ld, slice(0, split)),
                                       part(th, slice(0, split)), s0)
        y_b, f_b = scan(part(x, slice(split, T)), part(ld, slice(split, T)),
                                       part(th, slice(split, T)), f_a)
        assert_scaled(torch.cat([y_a, y_b], dim=1), y_full, what="y")
        assert_scaled(f_b, f_full, what="final")


# ----------------------------------------------------------------------------------------------------------
# Gradients
# ----------------------------------------------------------------------------------------------------------
GRAD_CASES = [  # (B, T, H, D, ld, th, h0)
    (2, 37, 3, 6, "dep", "dep", True),
    (2, 37, 3, 6, "static", "static", True),
    (2, 29, 1, 6, "static", "dep", False),
    (3, 13, 1, 4, (1, 13, 1, 2), (3, 1, 1, 2), True),
    (1, 1, 3, 4, "dep", "static", True),
]


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: "B{}T{}H{}D{}-{}-{}-{}".format(*c))
def test_gradients_match_reference(case, layout):
    B, T, H, D, lds, ths, h0 = case
    seed = 300 + seed_of(case)
    x, ld, th, s0 = make_inputs(seed, B, T, H, D, lds, ths, h0)
    (y, f), (yr, fr), got, want, ups = grads_both(x, ld, th, s0, seed=seed)
    assert_scaled(y, yr, what="y")
    assert_scaled(f, fr, what="final")
    check_grads(x, ld, th, s0, got, want, ups)


def test_gradients_shift_by_load(monkeypatch):
    # The backward's fallback for Triton without tl.gather: a_{t+1} from a second, shifted load.
    monkeypatch.setattr(triton_scan, "_SHIFT_GATHER", False)
    x, ld, th, s0 = make_inputs(33, 2, 19, 1, 6, "dep", "dep", True)
    (y, f), (yr, fr), got, want, ups = grads_both(x, ld, th, s0, seed=33)
    check_grads(x, ld, th, s0, got, want, ups)


@pytest.mark.parametrize("use", [(True, False), (False, True)], ids=["y-only", "final-only"])
def test_gradients_one_output(use, layout):
    x, ld, th, s0 = make_inputs(40 + use[0], 2, 11, 1, 6, "dep", "static", True)
    _, _, got, want, ups = grads_both(x, ld, th, s0, seed=40 + use[0], use_y=use[0], use_final=use[1])
    check_grads(x, ld, th, s0, got, want, ups)


def test_partial_requires_grad(layout):
    # Only some inputs require grad: the others get none and the kernel skips their work.
    x, ld, th, s0 = make_inputs(50, 2, 10, 1, 6, "dep", "dep", True)
    xg = x.clone().requires_grad_()
    y, f = scan(xg, ld, th, s0)
    (gx,) = torch.autograd.grad(y.sum() + f.sum(), (xg,))
    xr = x.to(torch.float64).requires_grad_()
    yr, fr = scan_reference(xr, ld, th, s0)
    (gxr,) = torch.autograd.grad(yr.sum() + fr.sum(), (xr,))
    assert_scaled(gx, gxr, what="dx")

    thg = th.clone().requires_grad_()
    y, f = scan(x, ld, thg, None)
    (gth,) = torch.autograd.grad(y.sum() + 2 * f.sum(), (thg,))
    thr = th.to(torch.float64).requires_grad_()
    yr, fr = scan_reference(x, ld, thr, None)
    (gthr,) = torch.autograd.grad(yr.sum() + 2 * fr.sum(), (thr,))
    assert_scaled(gth, gthr, what="dtheta")


@pytest.mark.parametrize("ld_range", [(-1e-4, 0.0), (-20.0, -20.0)], ids=["near-0", "minus-20"])
def test_decay_extremes(ld_range, layout):
    # Near 0: states grow like a random walk, nothing forgotten. −20: a_t ≈ 2e-9, s_t ≈ x_t.
    seed = 60 + int(ld_range[0] < -1)
    x, ld, th, s0 = make_inputs(seed, 2, 40, 1, 6, "dep", "static", True, ld_range=ld_range)
    (y, f), (yr, fr), got, want, ups = grads_both(x, ld, th, s0, seed=seed)
    assert_scaled(y, yr, what="y")
    assert_scaled(f, fr, what="final")
    check_grads(x, ld, th, s0, got, want, ups)


# ----------------------------------------------------------------------------------------------------------
# Low precision
# ----------------------------------------------------------------------------------------------------------
def test_bf16_forward_and_gradients(layout):
    x, ld, th, s0 = make_inputs(70, 2, 33, 3, 6, "dep", "static", True, dtype=torch.bfloat16)
    # The reference runs on the bf16-rounded inputs (exactly representable in float64).
    (y, f), (yr, fr), got, want, ups = grads_both(x, ld, th, s0, seed=70)
    assert y.dtype == torch.bfloat16 and f.dtype == torch.float32
    assert_lowp(y, yr, BF16_UNIT, "y")
    assert_scaled(f, fr, what="final")  # the state stays float32
    assert got[0].dtype == torch.bfloat16
    assert_lowp(got[0], want[0], BF16_UNIT, "dx")
    for name, a, b in zip(["log_decay", "theta", "initial_state"], got[1:], want[1:]):
        if name == "theta":  # static: reduced over (B, T)
            terms = reduced_grad_scale(x, ld, th, s0, ups[0], ups[1], "th")
            assert ((a.double() - b).abs() <= RTOL * terms).all(), name
        else:
            assert_scaled(a, b, what=name)


def test_fp16_forward(layout):
    x, ld, th, s0 = make_inputs(80, 2, 21, 1, 6, "static", "dep", False, dtype=torch.float16)
    y, f = scan(x, ld, th, s0)
    yr, fr = scan_reference(x, ld, th, s0)
    assert y.dtype == torch.float16
    assert_lowp(y, yr, FP16_UNIT, "y")
    assert_scaled(f, fr, what="final")


# ----------------------------------------------------------------------------------------------------------
# Every output element is written
# ----------------------------------------------------------------------------------------------------------
def test_outputs_fully_written(monkeypatch, layout):
    """All buffers the module allocates (y, final, checkpoints, dx, dlog_decay, dtheta, dinitial) start as
    NaN; any element the kernels fail to write would surface as NaN in the results or a mismatch."""
    calls = []

    def nan_empty(shape, dtype, device):
        calls.append(tuple(shape))
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(triton_scan, "empty_buffer", nan_empty)
    # T=13 (partial last tile), P=5 (partial last pair block), batch-shared time-varying decay (reduced
    # over B), per-batch static angle (reduced over T), an initial state.
    x, ld, th, s0 = make_inputs(90, 2, 13, 3, 10, (1, 13, 3, 5), (2, 1, 3, 5), True)
    (y, f), (yr, fr), got, want, ups = grads_both(x, ld, th, s0, seed=90)
    assert len(calls) >= 7, calls  # y, final, checkpoints, dx, dld, dth, dh0 all came from empty_buffer
    assert_scaled(y, yr, what="y")
    assert_scaled(f, fr, what="final")
    check_grads(x, ld, th, s0, got, want, ups)

    # The no-grad path (no checkpoints) too.
    calls.clear()
    y, f = scan(x, ld, th, s0)
    assert len(calls) == 2
    assert_scaled(y, yr, what="y (no grad)")
    assert_scaled(f, fr, what="final (no grad)")


# ----------------------------------------------------------------------------------------------------------
# The kernels' exp/sincos helper, and the public entry point
# ----------------------------------------------------------------------------------------------------------
@triton.jit
def _decay_probe(ld_ptr, th_ptr, re_ptr, im_ptr, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    ar, ai = complex_decay(tl.load(ld_ptr + i, mask=m, other=0.0), tl.load(th_ptr + i, mask=m, other=0.0))
    tl.store(re_ptr + i, ar, mask=m)
    tl.store(im_ptr + i, ai, mask=m)


def test_decay_helper_accuracy():
    """``a = exp(ld − i·th)`` with the kernels' own shared-reduction sin/cos: within ~1 ulp of float64 on
    a dense grid of angles up to ±1000 rad, quadrant boundaries (multiples of π/4) and a few large ones."""
    g = torch.Generator().manual_seed(5)
    th = torch.cat([torch.linspace(-1000.0, 1000.0, 4001), 3 * torch.randn(1000, generator=g),
                    (torch.arange(-400, 401, dtype=torch.float64) * (math.pi / 4)).float(),
                    torch.tensor([0.0, 1e-30, -1e-30, 1e-8, 12345.678, -1e5, 1e6])])
    ld = -3 * torch.rand(th.shape, generator=g)
    n = th.numel()
    re = torch.empty(n, device=DEVICE)
    im = torch.empty(n, device=DEVICE)
    _decay_probe[(triton.cdiv(n, 1024),)](ld.to(DEVICE), th.to(DEVICE), re, im, n, BLOCK=1024)
    want = torch.exp(torch.complex(ld.double(), -th.double()))
    err = (torch.complex(re.cpu().double(), im.cpu().double()) - want).abs() / want.abs()
    # fp32 unit roundoff is 6e-8: exp and the sin/cos each add about one rounding.
    assert err.max().item() < 3e-7, (err.max().item(), th[err.argmax()].item())


def test_public_interface_uses_this_backend():
    """Through ``hybrid.kernels.complex_scan.complex_scan(backend="triton")``, whose normalisation turns a static
    ``(H, P)`` decay into ``(1, 1, H, P)``."""
    complex_scan = pytest.importorskip("hybrid.kernels.complex_scan").complex_scan
    x, _, th, s0 = make_inputs(95, 2, 12, 3, 6, "static", "dep", True)
    ld = -torch.rand(3, 3, generator=torch.Generator().manual_seed(96))  # (H, P)
    y, f = complex_scan(x.to(DEVICE), ld.to(DEVICE), th.to(DEVICE), s0.to(DEVICE), output_final_state=True, backend="triton")
    yr, fr = scan_reference(x, ld, th, s0)
    assert_scaled(y.cpu(), yr, what="y")
    assert_scaled(f.cpu(), fr, what="final")


# ----------------------------------------------------------------------------------------------------------
# The runs layout's own shapes, and the layout the backward follows
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block", [(8, 4, 1, 1), (8, 1, 2, 1), (8, 8, 2, 1), ((4, 8), 2, 2, 1), ((8, 16), 4, 1, 3)],
                         ids=["S8xR1", "S1xR8", "S1xR8-BP2", "S2xR2:S4xR2", "S2xR4:S4xR4-BP1-stages3"])
def test_runs_shapes(block):
    """Runs of one step (every step its own run: the cross-run scan does all the work), one run a tile (no
    cross-run scan), and backward tiles twice the forward's; T = 13 (a partial last tile and partial last runs),
    P = 3 (a partial last pair block), gradients of every input; one with the pipelined loop (3 stages: the
    interpreter runs it as a plain loop, the compiled form is checked by test_aot and on a GPU)."""
    bt, run, bp, stages = block
    seed = seed_of(block[:3])
    x, ld, th, s0 = make_inputs(seed, 2, 13, 1, 6, "dep", "static", True)
    with scan_layout("runs", stages=stages), forced_blocks(bt, bp, run=run):
        (y, f), (yr, fr), got, want, ups = grads_both(x, ld, th, s0, seed=seed)
    assert_scaled(y, yr, what="y")
    assert_scaled(f, fr, what="final")
    check_grads(x, ld, th, s0, got, want, ups)


class _Launches:
    """Counts the launches of one kernel of ``triton_scan._KERNELS``."""

    def __init__(self, kernel):
        self.kernel, self.count = kernel, 0

    def __getitem__(self, grid):
        self.count += 1
        return self.kernel[grid]


@pytest.mark.parametrize("forward_layout", ["tile", "runs"])
def test_backward_follows_the_forwards_layout(forward_layout, monkeypatch):
    """The backward reads the checkpoints the forward wrote, so it runs in the forward's layout (carried by the
    op's ``tile`` output) whatever layout holds when autograd calls it."""
    other = "runs" if forward_layout == "tile" else "tile"
    launches = {key: _Launches(k) for key, k in triton_scan._KERNELS.items()}
    for key, counted in launches.items():
        monkeypatch.setitem(triton_scan._KERNELS, key, counted)
    x, ld, th, s0 = make_inputs(97, 2, 19, 2, 6, "dep", "dep", True)
    leaves = [v.clone().requires_grad_() for v in (x, ld, th, s0)]
    with scan_layout(forward_layout):
        y, f = scan(*leaves)
    with scan_layout(other):
        got = torch.autograd.grad((y * y).sum() + f.sum(), leaves)
    ref = [v.detach().to(torch.float64).requires_grad_() for v in (x, ld, th, s0)]
    yr, fr = scan_reference(*ref)
    want = torch.autograd.grad((yr * yr).sum() + fr.sum(), ref)
    assert {key: c.count for key, c in launches.items()} == {
        (forward_layout, "fwd"): 1, (forward_layout, "bwd"): 1, (other, "fwd"): 0, (other, "bwd"): 0}
    for name, a, b in zip(["x", "log_decay", "theta", "initial_state"], got, want):
        assert_scaled(a, b, what=name)


def test_layout_names_are_checked():
    with pytest.raises(ValueError, match=r"^scan_layout: expected one of \('tile', 'runs'\), got 'rows'$"):
        with scan_layout("rows"):
            pass
    with pytest.raises(ValueError, match=r"^scan_layout: expected stages in 1..4, got 0$"):
        with scan_layout("runs", stages=0):
            pass


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` one element past a pair boundary (its pairs straddle the 64-bit words)."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:]
    return flat.copy_(t.reshape(-1)).view(t.shape)


def test_runs_layout_with_unaligned_pairs(monkeypatch):
    """The runs kernels move whole pairs as words, so an x at an odd element offset runs in the tile layout, and an
    upstream gradient at an odd offset is copied; either way the numbers match the reference."""
    launches = {key: _Launches(k) for key, k in triton_scan._KERNELS.items()}
    for key, counted in launches.items():
        monkeypatch.setitem(triton_scan._KERNELS, key, counted)
    x, ld, th, s0 = make_inputs(98, 2, 11, 1, 6, "dep", "static", True)
    xs = _misaligned(x.to(DEVICE)).requires_grad_()
    assert xs.is_contiguous() and xs.data_ptr() % 8 != 0
    with scan_layout("runs"):
        y, f = complex_scan(xs, ld.to(DEVICE), th.to(DEVICE), s0.to(DEVICE), output_final_state=True,
                            backend="triton", check_values=False)
    assert launches[("tile", "fwd")].count == 1 and launches[("runs", "fwd")].count == 0
    yr, fr = scan_reference(x, ld, th, s0)
    assert_scaled(y.cpu(), yr, what="y")

    xa = x.to(DEVICE).requires_grad_()
    with scan_layout("runs"):
        y, f = complex_scan(xa, ld.to(DEVICE), th.to(DEVICE), s0.to(DEVICE), output_final_state=True,
                            backend="triton", check_values=False)
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(99))
    (gx,) = torch.autograd.grad(y, (xa,), _misaligned(gy.to(DEVICE)))
    assert launches[("runs", "bwd")].count == 1
    xr = x.to(torch.float64).requires_grad_()
    yr, _ = scan_reference(xr, ld, th, s0)
    (gxr,) = torch.autograd.grad(yr, (xr,), gy.to(torch.float64))
    assert_scaled(gx.cpu(), gxr, what="dx")


@pytest.mark.parametrize("layout", ["tile", "runs"])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
def test_op_shapes_do_not_depend_on_the_layout_taken(layout, aligned, monkeypatch):
    """The op's fake implementation (what torch.compile traces) gives the checkpoint buffer as many rows as the
    kernel's launch allocates, in either layout, also when an unaligned x makes the runs layout fall back to the
    tile layout (the shape function cannot see the alignment). ``opcheck`` compares fake and real outputs. The
    runs layout's default tile is made twice the tile layout's (8 steps each under the interpreter; on a GPU
    they differ)."""
    monkeypatch.setattr(triton_scan, "runs_default", lambda T, P, interpret: (4, 4, 4, 1))
    x, ld, th, s0 = make_inputs(100, 2, 21, 1, 6, "dep", "static", True)
    x = x.to(DEVICE) if aligned else _misaligned(x.to(DEVICE))
    ld, th, s0 = ld.to(DEVICE), th.to(DEVICE), s0.to(DEVICE)
    with scan_layout(layout):
        torch.library.opcheck(torch.ops.hybrid.complex_scan.default, (x, ld, th, s0, "triton", 0, True),
                              test_utils=("test_faketensor",))
        _, _, ck, _ = torch.ops.hybrid.complex_scan.default(x, ld, th, s0, "triton", 0, True)
    assert ck.shape[2] == triton_scan.checkpoint_rows(2, 21, 1, 3)


def test_one_tuning_serves_every_long_length():
    """The autotune key's length: T rounded up to a power of two up to 1024, then 1024 (every tile fits and a
    program walks 16 tiles or more), so a model evaluated at 2K, 4K, 8K and 16K is tuned once, not four times."""
    lengths = (1, 5, 64, 1000, 1024, 1025, 2048, 16384, 65536)
    assert [triton_scan.tuning_bucket(T) for T in lengths] == [1, 8, 64, 1024, 1024, 1024, 1024, 1024, 1024]
