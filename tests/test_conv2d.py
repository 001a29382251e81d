"""Conv2D and its backprops: the TF behaviours docs/conv2d.md lists, each pinned here or by
a case of tfgrad/testing/cases/conv2d.py (tests/test_conformance.py runs those against
TF's fixtures and TF live).

- TF's paths and plans: the image patches' cost model K-shards a small deep convolution
  that MatMul's plan would not; the MatMulConvFunctor shapes take MatMul's plan;
  BackpropInput's parallel contraction vs the sharded direct sgemm (nocopy, smalln_tn,
  gemv_t); BackpropFilter's L3 shards.
- oneDNN's gemm_smalln_tn and gemv_t orders, compiled kernel == NumPy reference.
- Gradients: the three ops differentiate each other as TF's nn_grad.py does (first and
  second order against TF's tapes).
- The same bits on any number of Numba threads.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

import tfgrad
from tests import oracle
from tfgrad import _config, raw_ops
from tfgrad._tf.cpuid import use_onednn_isa
from tfgrad.kernels import conv2d as k
from tfgrad.ops import conv2d as C
from tfgrad.ops import matmul as mm

F32 = np.float32


def _geo(op: str, N: int, H: int, W: int, Cin: int, O: int, K: int, s: int = 1,
         padding: str = "SAME", d: int = 1) -> C.Geometry:
    return C.window_of(op, (1, s, s, 1), padding, (), (1, d, d, 1), (N, H, W, Cin),
                       (K, K, Cin, O))


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


def _tf():
    tf = oracle.tensorflow()
    if tf is None:
        pytest.skip("TensorFlow is not installed")
    return tf


def _on_two_tf_threads(monkeypatch):
    """TF in this process if it runs on 2 intra-op threads (the paths a test pins are
    those of 2 threads: more threads change TF's choice), else None; tfgrad plans for 2."""
    tf = oracle.tensorflow() if _config.tf_intra_op_threads() == 2 else None
    monkeypatch.setenv("TFGRAD_TF_INTRA_OP_THREADS", "2")
    return tf


# --------------------------------------------------------------------------------------
# Plans (the cases deep_3x3_c256 / c384, deep_1x1_c1280, smalln_*, one_pixel_*,
# deep_out_* pin them against TF's bits)
# --------------------------------------------------------------------------------------
def test_patches_cost_model_shards_deep_small_convolutions():
    geo = _geo("Conv2D", 1, 3, 3, 256, 2, 3)
    assert C.forward_plan(geo, "SAME").path == "sharded"
    assert mm.plan(geo.N * geo.P, geo.F, geo.O).path != "sharded"  # MatMul's would not


def test_matmul_conv_functor_shapes_take_matmuls_plan():
    for geo, pad in ((_geo("Conv2D", 1, 2, 2, 1280, 4, 1), "SAME"),
                     (_geo("Conv2D", 3, 5, 5, 16, 8, 5, padding="VALID"), "VALID")):
        assert C.matmul_path(geo, pad)
        assert C.forward_plan(geo, pad) == mm.plan(geo.N * geo.P, geo.F, geo.O)
    geo = _geo("Conv2D", 1, 4, 4, 8, 4, 1)
    assert not C.matmul_path(geo, "EXPLICIT")  # EXPLICIT 1x1: SpatialConvolution


@pytest.mark.parametrize("N,H,Cin,O,kind", [
    (1, 3, 2, 400, ""),         # batch 1: Eigen's contraction
    (2, 4, 2, 800, "nocopy"),   # OH*OW = 16: the nocopy kernel, K passes
    (3, 3, 8, 16, "smalln"),    # 1 < OH*OW < 16 (AVX-512's gemm_smalln_tn)
    (2, 1, 8, 16, "gemv"),      # one pixel
])
def test_backprop_input_paths(N, H, Cin, O, kind):
    geo = _geo("Conv2DBackpropInput", N, H, H, Cin, O, 1)
    with use_onednn_isa("avx512_core"):
        assert C.input_direct_kind(geo) == kind
    with use_onednn_isa("avx2"):  # (no gemm_smalln_tn in oneDNN's AVX2 build)
        assert C.input_direct_kind(geo) == ("nocopy" if kind == "smalln" else kind)


def test_backprop_filter_shards_follow_tfs_l3_rule():
    geo = _geo("Conv2DBackpropFilter", 32, 224, 224, 3, 32, 3, 2)
    assert C.filter_shard(geo) == 11  # ceil(30 MiB / 4 / (12544 * 27 + 12544 * 32 + 864))


# --------------------------------------------------------------------------------------
# oneDNN's small kernels: compiled == reference, and TF live
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("R", [9, 16, 37])  # (rows in blocks of 16, and one at a time)
@pytest.mark.parametrize("K", [1, 2, 5, 15, 16, 17, 33, 100, 385])
def test_smalln_kernel_equals_reference(K, R):
    rng = np.random.default_rng(K)
    A = rng.standard_normal((R, K)).astype(F32)
    B = rng.standard_normal((5, K)).astype(F32)
    A[0, 0] = 0
    A[R - 1, :] = -0.0  # (a row of -0 products: the halving's zero signs)
    A[1, K // 2] = 1e-40  # (a denormal: read as 0)
    out = np.empty((R, 5), F32)
    k.smalln.serial(A, B, out)
    assert np.array_equal(_bits(out), _bits(C.smalln_reference(A, B)))
    k.smalln.parallel(A, B, out)
    assert np.array_equal(_bits(out), _bits(C.smalln_reference(A, B)))


@pytest.mark.parametrize("C_in,KW,stride,dilation,padding", [
    (3, 3, 2, 1, "SAME"), (5, 3, 1, 1, "SAME"), (16, 1, 1, 1, "VALID"),
    (17, 1, 1, 1, "VALID"), (2, 5, 1, 2, "SAME"), (6, 2, 3, 1, "VALID")])
def test_im2col_kernel_equals_reference(C_in, KW, stride, dilation, padding):
    from tfgrad.dispatch import conv2d as D

    rng = np.random.default_rng(C_in * KW)
    x = rng.standard_normal((2, 9, 11, C_in)).astype(F32)
    f = rng.standard_normal((3, KW, C_in, 4)).astype(F32)
    geo = C._checked(C.FORWARD, {
        "input": x, "filter": f, "strides": [1, stride, stride, 1], "padding": padding,
        "explicit_paddings": [], "data_format": "NHWC", "dilations": [1, dilation, dilation, 1]})
    assert np.array_equal(_bits(D._cols(x, geo)), _bits(C.im2col(x, geo)))


@pytest.mark.parametrize("P,O", [(2, 3), (9, 17), (15, 100), (9, 800), (1, 33), (1, 129)])
@oracle.onednn_modelled
def test_small_direct_kernels_against_tf(P, O):
    """oneDNN's gemm_smalln_tn (16 FMA lanes, halved) and gemv_t for one pixel, through
    a 1x1 BackpropInput of 2 images (TF's sharded path)."""
    tf = _tf()
    rng = np.random.default_rng(P * 1000 + O)
    dy = rng.standard_normal((2, 1, P, O)).astype(F32)
    w = rng.standard_normal((1, 1, 8, O)).astype(F32)
    kw = dict(strides=[1, 1, 1, 1], padding="VALID")
    want = tf.raw_ops.Conv2DBackpropInput(input_sizes=[2, 1, P, 8], filter=w,
                                          out_backprop=dy, **kw).numpy()
    for impl in ("kernel", "reference"):
        with _config.use_impl(impl):
            got = raw_ops.Conv2DBackpropInput(input_sizes=[2, 1, P, 8], filter=w,
                                              out_backprop=dy, **kw)
        assert np.array_equal(_bits(got), _bits(want)), impl


def test_backprop_input_edge_blocks_are_per_image(monkeypatch):
    """Eigen's one-wide edge blocks (TF's last row of each image's contraction) on the
    parallel path of 2 TF threads: one contraction per image, not one per chunk of
    images. Kernel == reference (== TF where it runs on 2 threads)."""
    tf = _on_two_tf_threads(monkeypatch)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((1, 1, 128, 1024)).astype(F32)
    dy = rng.standard_normal((2, 7, 7, 1024)).astype(F32)
    kw = dict(input_sizes=[2, 7, 7, 128], filter=w, out_backprop=dy, strides=[1, 1, 1, 1],
              padding="SAME")
    geo = _geo("Conv2DBackpropInput", 2, 7, 7, 128, 1024, 1)
    assert C.input_direct_kind(geo) == ""
    assert any(sh.gemv_n for sh in C.input_plan(geo).shards)
    got = raw_ops.Conv2DBackpropInput(**kw)
    with _config.use_impl("reference"):
        assert np.array_equal(_bits(raw_ops.Conv2DBackpropInput(**kw)), _bits(got))
    if tf is not None:
        assert np.array_equal(_bits(got), _bits(tf.raw_ops.Conv2DBackpropInput(**kw).numpy()))


# --------------------------------------------------------------------------------------
# Eigen's own GEMV (a contraction with one output row): its k-blocks
# --------------------------------------------------------------------------------------
def test_gemv_block_follows_the_lhs_stride():
    """Blocks of 16 from K = 128, 4 where the GEMV's lhs stride reaches 32000 bytes: the
    forward's filter [K, O] has stride O; BackpropInput's transposed filter stride 1."""
    from tfgrad._tf.conv2d import gemv_block

    assert gemv_block(np.zeros((100, 9000), F32)) == 100
    assert gemv_block(np.zeros((200, 7999), F32)) == 16
    assert gemv_block(np.zeros((200, 8000), F32)) == 4
    assert gemv_block(np.zeros((9000, 200), F32).T) == 16


@pytest.mark.parametrize("op,N,H,Cin,O,K", [
    ("Conv2D", 1, 1, 200, 8000, 1),                  # filter stride 8000: blocks of 4
    ("Conv2D", 1, 3, 20, 7999, 3),                   # blocks of 16
    ("Conv2DBackpropInput", 2, 1, 8001, 128, 1),     # F = 8001, blocks of 16
    ("Conv2DBackpropInput", 32, 1, 112, 1280, 1),    # MobileNetV2's last 1x1: 32 images
    ("Conv2DBackpropInput", 3, 3, 40, 2048, 3),      # a 3x3 filter over a 3x3 image
])
def test_one_output_pixel_is_eigens_gemv(op, N, H, Cin, O, K, monkeypatch):
    """One output pixel per image on TF's Eigen-contraction path (2 TF threads): each
    image's contraction is Eigen's GEMV (all images in one launch), kernel == reference
    (== TF where it runs on 2 threads)."""
    tf = _on_two_tf_threads(monkeypatch)
    rng = np.random.default_rng(N * 7 + O)
    w = rng.standard_normal((K, K, Cin, O)).astype(F32)
    kw = dict(strides=[1, 1, 1, 1], padding="VALID")
    if op == "Conv2D":
        args = dict(input=rng.standard_normal((N, H, H, Cin)).astype(F32), filter=w, **kw)
    else:
        assert C.input_direct_kind(_geo(op, N, H, H, Cin, O, K, padding="VALID")) == ""
        args = dict(input_sizes=[N, H, H, Cin], filter=w,
                    out_backprop=rng.standard_normal((N, 1, 1, O)).astype(F32), **kw)
    got = getattr(raw_ops, op)(**args)
    with _config.use_impl("reference"):
        assert np.array_equal(_bits(getattr(raw_ops, op)(**args)), _bits(got))
    if tf is not None:
        assert np.array_equal(_bits(getattr(tf.raw_ops, op)(**args).numpy()), _bits(got))


@pytest.mark.live
@oracle.onednn_modelled
@pytest.mark.parametrize("N,H,Cin,O", [(24, 25, 24, 10), (16, 20, 32, 12)])
def test_narrow_filter_gradients_take_tfs_plan(N, H, Cin, O):
    """A filter gradient with few output channels (Eigen's m = O, K = the pixels): Eigen's
    cost model rates it with the unsharded bandwidth whatever the sharding, and shards it
    by K or keeps it on one thread (docs/matmul.md). [24, 25, 25, 24] with 10 channels
    differed in 91% of its outputs on 2 threads while the model took the bandwidth by
    column. Kernel == reference == TF."""
    tf = _tf()
    rng = np.random.default_rng(N + O)
    args = dict(input=rng.standard_normal((N, H, H, Cin)).astype(F32),
                filter_sizes=np.array([3, 3, Cin, O], np.int32),
                out_backprop=rng.standard_normal((N, H, H, O)).astype(F32),
                strides=[1, 1, 1, 1], padding="SAME")
    got = raw_ops.Conv2DBackpropFilter(**args)
    with _config.use_impl("reference"):
        assert np.array_equal(_bits(raw_ops.Conv2DBackpropFilter(**args)), _bits(got))
    assert np.array_equal(_bits(tf.raw_ops.Conv2DBackpropFilter(**args).numpy()), _bits(got))


# --------------------------------------------------------------------------------------
# Conv2D's patches a chunk of output rows at a time
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("N,H,Cin,O,K,s", [
    (3, 12, 3, 16, 3, 2),   # a stem: image boundaries inside chunks
    (1, 31, 32, 8, 3, 1),   # Eigen's one-wide last n-block (gemv_n, TF's last pixel)
    (1, 7, 16, 24, 3, 1),   # the same, sequential plan
    (1, 3, 256, 2, 3, 1),   # K-sharded plan
    (2, 9, 2, 1, 3, 1),     # one output channel (gemv_t, TF's last column)
    (2, 5, 1, 7, 3, 5),     # one output pixel per row (OW = 1)
])
@pytest.mark.parametrize("patches", [1, 40, 700])
@oracle.onednn_modelled
def test_forward_patches_in_chunks_keep_the_bits(N, H, Cin, O, K, s, patches, monkeypatch):
    """Conv2D builds its im2col a chunk of output rows at a time (``_PATCHES`` floats):
    each row's sums depend on the plan alone, except TF's last pixel in a plan whose
    last n-block is one wide, which only the last chunk recomputes."""
    from tfgrad.dispatch import conv2d as D

    rng = np.random.default_rng(N * 1000 + H * 10 + O)
    x = rng.standard_normal((N, H, H, Cin)).astype(F32)
    w = rng.standard_normal((K, K, Cin, O)).astype(F32)
    kw = dict(strides=[1, s, s, 1], padding="SAME")
    with _config.use_impl("reference"):
        want = raw_ops.Conv2D(input=x, filter=w, **kw)
    monkeypatch.setattr(D, "_PATCHES", patches)
    got = raw_ops.Conv2D(input=x, filter=w, **kw)
    assert np.array_equal(_bits(got), _bits(want))
    tf = oracle.tensorflow()
    if tf is not None:
        assert np.array_equal(_bits(got), _bits(tf.raw_ops.Conv2D(input=x, filter=w, **kw)))


@pytest.mark.parametrize("patches", [1, 40])
def test_chunks_of_a_many_shard_plan_keep_the_tail(patches, monkeypatch):
    """On 8 TF threads [1, 3, 3, 256] x 3x3 -> 2 channels is K-sharded into 4 shards or
    more, whose buffers Eigen adds in groups, ``(b0 + b1) + (b2 + b3)`` on whole packets
    of 8 and ``b0 + ((s0 + s1) + s2)`` on the outputs past them: the tail of the whole
    output, not of each chunk of rows (a chunk's own tail differed by 2 ulp)."""
    from tfgrad.dispatch import conv2d as D
    monkeypatch.setenv("TFGRAD_TF_INTRA_OP_THREADS", "8")
    assert len(C.forward_plan(_geo("Conv2D", 1, 3, 3, 256, 2, 3), "SAME").shards) >= 4
    rng = np.random.default_rng(1032)
    x = rng.standard_normal((1, 3, 3, 256)).astype(F32)
    w = rng.standard_normal((3, 3, 256, 2)).astype(F32)
    kw = dict(strides=[1, 1, 1, 1], padding="SAME")
    with _config.use_impl("reference"):
        want = raw_ops.Conv2D(input=x, filter=w, **kw)
    monkeypatch.setattr(D, "_PATCHES", patches)
    assert np.array_equal(_bits(raw_ops.Conv2D(input=x, filter=w, **kw)), _bits(want))


def test_forward_patches_are_bounded(monkeypatch):
    """A stem's patch matrix (over twice its input) is never built whole: the forward
    allocates its output and one chunk of patches (``_PATCHES`` floats)."""
    import tracemalloc

    from tfgrad.dispatch import conv2d as D

    x = np.random.default_rng(1).standard_normal((4, 120, 120, 3)).astype(F32)
    w = np.ones((3, 3, 3, 16), F32)
    kw = dict(strides=[1, 2, 2, 1], padding="SAME")
    patches = 4 * 60 * 60 * 27 * 4
    assert patches > 2 * x.nbytes

    def peak() -> int:
        raw_ops.Conv2D(input=x, filter=w, **kw)  # compiled, plans cached
        tracemalloc.start()
        try:
            out = raw_ops.Conv2D(input=x, filter=w, **kw)
            return tracemalloc.get_traced_memory()[1] - out.nbytes
        finally:
            tracemalloc.stop()

    monkeypatch.setattr(D, "_PATCHES", 1 << 16)
    assert peak() <= (1 << 18) + (1 << 16)
    monkeypatch.setattr(D, "_PATCHES", 1 << 30)  # (the whole matrix: what it guards)
    assert peak() >= patches


# --------------------------------------------------------------------------------------
# Gradients (TF's _Conv2DGrad, _Conv2DBackpropInputGrad, _Conv2DBackpropFilterGrad)
# --------------------------------------------------------------------------------------
@oracle.onednn_modelled
def test_first_and_second_order_gradients_match_tfs_tapes():
    tf = _tf()
    torch = pytest.importorskip("torch")
    import tfgrad.torch as tt

    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 6, 5, 3)).astype(F32)
    w = rng.standard_normal((3, 3, 3, 4)).astype(F32)
    g = rng.standard_normal((2, 3, 3, 4)).astype(F32)
    v = rng.standard_normal((2, 6, 5, 3)).astype(F32)
    attrs = dict(strides=[1, 2, 2, 1], padding="SAME")
    tx, tw = tf.constant(x), tf.constant(w)
    with tf.GradientTape() as outer:
        outer.watch(tw)
        with tf.GradientTape() as inner:
            inner.watch([tx, tw])
            y = tf.raw_ops.Conv2D(input=tx, filter=tw, **attrs)
            loss = tf.reduce_sum(y * g)
        dx, dw = inner.gradient(loss, [tx, tw])
        s = tf.reduce_sum(dx * v)  # d/dw of <dx, v>: Conv2DBackpropInput's own gradient
    ddw = outer.gradient(s, tw)

    px = torch.from_numpy(x).requires_grad_()
    pw = torch.from_numpy(w).requires_grad_()
    py = tt.conv2d(px, pw, **attrs)
    gx, gw = torch.autograd.grad(py, (px, pw), torch.from_numpy(g), create_graph=True)
    (gww,) = torch.autograd.grad(gx, (pw,), torch.from_numpy(v))
    for mine, theirs in ((gx, dx), (gw, dw), (gww, ddw)):
        assert np.array_equal(_bits(mine.detach().numpy()), _bits(theirs.numpy()))


def test_jax_gradients_are_the_backprop_ops():
    jax = pytest.importorskip("jax")
    from tfgrad.jax import raw_ops as jr

    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 5, 5, 3)).astype(F32)
    w = rng.standard_normal((3, 3, 3, 2)).astype(F32)
    g = rng.standard_normal((2, 5, 5, 2)).astype(F32)
    attrs = dict(strides=[1, 1, 1, 1], padding="SAME")
    _, vjp = jax.vjp(lambda a, b: jr.Conv2D(input=a, filter=b, **attrs), x, w)
    gx, gw = vjp(g)
    assert np.array_equal(_bits(np.asarray(gx)), _bits(raw_ops.Conv2DBackpropInput(
        input_sizes=list(x.shape), filter=w, out_backprop=g, **attrs)))
    assert np.array_equal(_bits(np.asarray(gw)), _bits(raw_ops.Conv2DBackpropFilter(
        input=x, filter_sizes=list(w.shape), out_backprop=g, **attrs)))


# --------------------------------------------------------------------------------------
# Threads and API
# --------------------------------------------------------------------------------------
def test_same_bits_on_one_and_two_threads():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 20, 20, 8)).astype(F32)
    w = rng.standard_normal((3, 3, 8, 16)).astype(F32)
    g = rng.standard_normal((4, 10, 10, 16)).astype(F32)
    attrs = dict(strides=[1, 2, 2, 1], padding="SAME")
    outs = []
    for t in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
        numba.set_num_threads(t)
        try:
            outs.append([raw_ops.Conv2D(input=x, filter=w, **attrs),
                         raw_ops.Conv2DBackpropInput(input_sizes=list(x.shape), filter=w,
                                                     out_backprop=g, **attrs),
                         raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=list(w.shape),
                                                      out_backprop=g, **attrs)])
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    for a, b in zip(*outs):
        assert np.array_equal(_bits(a), _bits(b))


def test_snake_case_names_are_tfs():
    assert tfgrad.conv2d is not None
    assert tfgrad.conv2d_backprop_input is not None
    assert tfgrad.conv2d_backprop_filter is not None
