"""tfgrad's task pool as ``kernels._pool.launch`` runs it (fractional pooling, reduction,
average pooling):
a kernel publishes its task count (``tasks``) and claims chunks of tasks, on the calling
thread alone or with the pool's threads. Python kernels here: ``tasks`` and ``claim`` run
as plain functions, and the chunks each call claims are recorded."""

from __future__ import annotations

import numpy as np
import pytest

from tfgrad import _compile
from tfgrad.kernels import _pool

_MIN = _compile.POLICY["reduction"].parallel_min


def _kernel(seen: list[tuple[int, int]]):
    """Claims tasks [0, n) and records its chunks; "fail" raises in task 5."""

    def kernel(n, tag, ctl, nthreads):
        size, cur = _pool.tasks(ctl, n, nthreads)
        while _pool.claim(ctl, size, n, cur):
            seen.append((int(cur[0]), int(cur[1])))
            if tag == "fail" and cur[0] <= 5 < cur[1]:
                raise ValueError("task 5")

    return kernel


def _tasks(seen: list[tuple[int, int]]) -> list[int]:
    return sorted(t for t0, t1 in seen for t in range(t0, t1))


def test_a_small_call_runs_every_task_on_the_calling_thread():
    """One chunk of every task, again on each call (the thread's own ctl is reused and
    started again: without that the second call claimed nothing)."""
    seen: list[tuple[int, int]] = []
    kernel = _kernel(seen)
    for n in (37, 1, 0, 37):
        seen.clear()
        _pool.launch("reduction", kernel, _MIN - 1, n, "ok", units=n)
        assert seen == ([(0, n)] if n else [])
    seen.clear()
    _pool.serial(kernel, 9, "ok")
    assert seen == [(0, 9)]


def test_a_large_call_covers_every_task_once_on_the_pool(monkeypatch):
    monkeypatch.setattr(_pool, "num_threads", lambda: 3)

    def run(tag: str) -> list[tuple[int, int]]:
        seen: list[tuple[int, int]] = []  # (its own: a failed call's threads may go on)
        _pool.launch("reduction", _kernel(seen), _MIN, 37, tag, units=37)
        return seen

    for _ in range(20):  # (the pool threads join at different points)
        seen = run("ok")
        assert _tasks(seen) == list(range(37)) and len(seen) > 2
    with pytest.raises(ValueError, match="task 5"):
        run("fail")
    assert _tasks(run("ok")) == list(range(37))  # the pool serves the next op
    with _pool._pool(2).busy:  # another op holds the pool: the caller runs it alone
        assert run("ok") == [(0, 37)]


@pytest.mark.parametrize("n", [1, 2, 7, 16, 17, 100, 1000])
@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_chunks_are_eight_a_thread(n, threads):
    ctl = np.zeros(3, np.int64)
    size, cur = _pool.tasks(ctl, n, threads)
    assert ctl[2] == n
    assert size == (n if threads == 1 else -(-n // min(n, 8 * threads)))
    assert list(cur) == [0, 0]
