"""The cache sizes Eigen reads from CPUID (``Eigen::internal::queryCacheSizes``), which
set its contraction blocking: leaves 0x80000005 / 0x80000006 on AMD (L1d KiB in
ECX[31:24], L2 KiB in ECX[31:16], L3 from EDX masked as Eigen masks it), leaf 4 on Intel
and others. A few bytes of machine code run CPUID (x86-64 Linux); elsewhere, or if that
fails, Eigen's defaults (32 KiB, 256 KiB, 2 MiB) are assumed."""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from .._config import X86

# cpuid(leaf=edi, subleaf=esi, out=rdx): mov rax,rdi; mov rcx,rsi; mov r8,rdx; push rbx;
# cpuid; mov [r8],eax; mov [r8+4],ebx; mov [r8+8],ecx; mov [r8+12],edx; pop rbx; ret
_CODE = bytes.fromhex(
    "4889f8" "4889f1" "4989d0" "53" "0fa2" "418900" "41895804" "41894808" "4189500c" "5b" "c3")


# xgetbv(ecx=0) -> rax: xor ecx,ecx; xgetbv; shl rdx,32; or rax,rdx; ret
_XGETBV = bytes.fromhex("31c9" "0f01d0" "48c1e220" "4809d0" "c3")


def _machine_code(code: bytes, prototype: type) -> Any:
    """``code`` on an executable page of its own, callable as ``prototype``."""
    buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(code)
    fn = prototype(ctypes.addressof(ctypes.c_char.from_buffer(buf)))
    fn._buf = buf  # keep the page alive
    return fn


@cache
def _cpuid_fn():  # type: ignore[no-untyped-def]
    return _machine_code(_CODE, ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32,
                                                 ctypes.POINTER(ctypes.c_uint32 * 4)))


def cpuid(leaf: int, sub: int = 0) -> tuple[int, int, int, int]:
    out = (ctypes.c_uint32 * 4)()
    _cpuid_fn()(leaf, sub, ctypes.byref(out))
    return out[0], out[1], out[2], out[3]


@cache
def eigen_caches() -> tuple[int, int, int]:
    """(L1, L2, L3) in bytes as Eigen's queryCacheSizes reports them on this processor."""
    if not X86:
        return 32 << 10, 256 << 10, 2 << 20
    try:
        _, b, c, d = cpuid(0)
        vendor = b.to_bytes(4, "little") + d.to_bytes(4, "little") + c.to_bytes(4, "little")
        if vendor in (b"AuthenticAMD", b"AMDisbetter!"):
            l1 = (cpuid(0x80000005)[2] >> 24) * 1024
            _, _, c6, d6 = cpuid(0x80000006)
            return l1, (c6 >> 16) * 1024, ((d6 & 0xFFFC000) >> 18) * 512 * 1024
        sizes = {1: 0, 2: 0, 3: 0}
        for i in range(16):  # Intel's deterministic cache parameters (leaf 4)
            a, b, c, _ = cpuid(4, i)
            kind = a & 31
            if kind == 0:
                break
            if kind in (1, 3):  # data or unified
                level = (a >> 5) & 7
                ways, parts = ((b >> 22) & 0x3FF) + 1, ((b >> 12) & 0x3FF) + 1
                size = ways * parts * ((b & 0xFFF) + 1) * (c + 1)
                if level in sizes:
                    sizes[level] = size
        return sizes[1], sizes[2], sizes[3]
    except (OSError, ValueError, AttributeError):
        return 32 << 10, 256 << 10, 2 << 20


@cache
def _xcr0() -> int:
    """XCR0: the register states the OS saves (XGETBV; the caller checks OSXSAVE)."""
    return int(_machine_code(_XGETBV, ctypes.CFUNCTYPE(ctypes.c_uint64))())


@cache
def avx512_core() -> bool:
    """Whether oneDNN takes its AVX-512 kernels here (``mayiuse(avx512_core)``: AVX-512 F,
    DQ, BW and VL in CPUID leaf 7, and the OS saving the ZMM state, XCR0 bits 5-7)."""
    if not X86:
        return False
    try:
        if cpuid(0)[0] < 7 or not cpuid(1)[2] >> 27 & 1:  # (OSXSAVE: XGETBV is usable)
            return False
        b = cpuid(7)[1]
        if not all(b >> bit & 1 for bit in (16, 17, 30, 31)):
            return False
        return _xcr0() & 0xE6 == 0xE6
    except (OSError, ValueError, AttributeError):
        return False


@cache
def avx2() -> bool:
    """Whether oneDNN's AVX2 kernels run here: AVX2 (CPUID leaf 7) with FMA (leaf 1) and
    the OS saving the YMM state (XCR0 bits 1-2)."""
    if not X86:
        return False
    try:
        if cpuid(0)[0] < 7:
            return False
        c1 = cpuid(1)[2]
        if not (c1 >> 27 & 1 and c1 >> 12 & 1 and cpuid(7)[1] >> 5 & 1):
            return False
        return _xcr0() & 6 == 6
    except (OSError, ValueError, AttributeError):
        return False


ISAS = ("avx512_core", "avx2")
_ISA: list[str] = []


def onednn_isa() -> str:
    """The sgemm kernel TF's contractions run here, as tfgrad models it: ``"avx2"`` on a
    processor with AVX2 and FMA but not ``avx512_core``, else ``"avx512_core"`` (also
    where oneDNN would run a kernel tfgrad does not model: AVX without FMA, not x86).
    ``TFGRAD_ONEDNN_ISA`` (one of :data:`ISAS`) overrides it, read once."""
    if not _ISA:
        env = os.environ.get("TFGRAD_ONEDNN_ISA", "")
        _ISA.append(env if env in ISAS else
                    "avx2" if avx2() and not avx512_core() else "avx512_core")
    return _ISA[0]


@contextmanager
def use_onednn_isa(isa: str) -> Iterator[None]:
    """Model oneDNN's ``isa`` kernel (one of :data:`ISAS`) inside the block, whatever this
    processor runs: for tests of one model's recorded bits on another processor."""
    if isa not in ISAS:
        raise ValueError(f"isa must be one of {ISAS}, got {isa!r}")
    old = onednn_isa()
    _ISA[0] = isa
    try:
        yield
    finally:
        _ISA[0] = old


def modelled() -> bool:
    """Whether TF's contractions on this processor run a kernel tfgrad models (its bits are
    TF's): AVX-512 (``avx512_core``) or AVX2 with FMA."""
    return avx512_core() or avx2()
