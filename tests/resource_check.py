"""Shared helpers of the resource tests (tests/test_resources_<framework>.py, one framework per
file and process): RSS growth of a long call loop, and concurrent calls from 8 threads.

RSS is read from /proc/self/statm (resident pages x page size) after a warm-up, half-way and
after the loop, with a `gc.collect()` before each reading. The allocators (glibc malloc,
pymalloc, the frameworks' own) grow the heap in one-time steps of 1-2 MiB even when nothing
leaks (seen under pytest: +2.5 MiB once in the first 100,000 `polyop.run` calls, then 0 over
each further 100,000), so the check is on the *smaller* of the two halves' growth: a leak
grows both halves, a one-time step only one. The bound, LEAK_BOUND = 512 KiB per half, is
exceeded by a leak of 64 bytes per call (50,000 calls a half: 3.1 MiB) and by 64 bytes per
failing call in the error loops (25,000 failing calls a half: 1.5 MiB).
:func:`assert_bound_detects_a_64_byte_leak` is the negative control next to each loop: the
same measurement over a loop that keeps one 64-byte object per (failing) call must exceed it.
RSS can miss a leak that refills memory freed earlier in the process (pymalloc pools are not
given back): in the ONNX Runtime error loop a leak of 64 B per failing call raised the first
half by only 240 KiB. So Python objects are counted as well (sys.getallocatedblocks, bound
BLOCKS_BOUND), which catches any leak of Python references exactly; native leaks are left to
RSS and to ci/memcheck.sh (Valgrind).

No timing is asserted anywhere; only memory and results.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import threading

import numpy as np

PAGE = os.sysconf("SC_PAGE_SIZE")
#: Calls per loop (issue 17 asks 100,000). POLYOP_RESOURCE_CALLS may raise it, never lower it
#: below what keeps the bound meaningful (the negative control checks that).
CALLS = int(os.environ.get("POLYOP_RESOURCE_CALLS", "100000"))
WARMUP = 2000
LEAK_BOUND = 512 << 10  # bytes, per half loop
THREADS = 8
#: Python objects (sys.getallocatedblocks) alive after a loop beyond those before it: a leak of
#: Python references (one object per call or per failing call) adds >= 25,000; a loop adds none.
BLOCKS_BOUND = 1000
LAST_BLOCKS = [0]  # set by rss_growth


_LIBC = ctypes.CDLL("libc.so.6")


def rss() -> int:
    """Resident set size of this process in bytes (/proc/self/statm, field 2), read after a
    garbage collection and `malloc_trim(0)`: memory freed earlier (by other tests) is given
    back to the OS first, so a leak that would refill it still shows as growth."""
    gc.collect()
    _LIBC.malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def rss_growth(step, calls: int = CALLS, warmup: int = WARMUP) -> tuple[int, int]:
    """RSS growth (bytes) over the first and the second half of ``calls`` calls of
    ``step(i)``, measured after ``warmup`` calls."""
    for i in range(warmup):
        step(i)
    r0 = rss()
    b0 = sys.getallocatedblocks()
    for i in range(warmup, warmup + calls // 2):
        step(i)
    r1 = rss()
    for i in range(warmup + calls // 2, warmup + calls):
        step(i)
    r2 = rss()
    LAST_BLOCKS[0] = sys.getallocatedblocks() - b0
    return r1 - r0, r2 - r1


def report(label: str, halves: tuple[int, int], calls: int = CALLS) -> str:
    """Print the measured growth (shown with pytest -s, and in the junit log on failure)."""
    a, b = halves
    line = (f"RSS {label}: {(a + b) / 1024:+.0f} KiB over {calls} calls, "
            f"{LAST_BLOCKS[0]:+d} Python objects "
            f"(halves {a / 1024:+.0f} / {b / 1024:+.0f} KiB; smaller half "
            f"{min(a, b) / (calls // 2):+.1f} B/call; bound {LEAK_BOUND >> 10} KiB per half)")
    print(line)
    return line


def check_loop(label: str, step, calls: int = CALLS, bound: int = LEAK_BOUND) -> tuple[int, int]:
    halves = rss_growth(step, calls)
    line = report(label, halves, calls)
    assert min(halves) < bound, f"leak: {line} (bound here {bound >> 10} KiB)"
    assert LAST_BLOCKS[0] < BLOCKS_BOUND, f"leak: {LAST_BLOCKS[0]} more Python objects; {line}"
    return halves


def assert_bound_detects_a_64_byte_leak(failing_calls: int) -> None:
    """Negative control: keeping one 64-byte object per call (plus its list slot) over
    ``failing_calls`` calls makes the same measurement exceed LEAK_BOUND."""
    keep = []
    obj_size = sys.getsizeof(bytes(31))
    assert obj_size == 64, obj_size
    halves = rss_growth(lambda i: keep.append(bytes(31)), failing_calls, warmup=0)
    assert len(keep) == failing_calls
    line = report(f"negative control, 64 B kept per call x {failing_calls}", halves, failing_calls)
    assert min(halves) > LEAK_BOUND, f"the bound does not detect a 64-byte leak: {line}"
    assert LAST_BLOCKS[0] > BLOCKS_BOUND, line


def run_threads(work, n_threads: int = THREADS) -> list:
    """Run ``work(thread_index)`` on ``n_threads`` Python threads started together; return
    the results in thread order (re-raising the first exception)."""
    barrier = threading.Barrier(n_threads)
    results: list = [None] * n_threads
    errors: list = []

    def body(t):
        try:
            barrier.wait()
            results[t] = work(t)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return results


def numpy_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax along the last axis in float64."""
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def numpy_topk(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k along the last axis, largest first, ties to the lower index: (values, indices)."""
    order = np.argsort(-x, axis=-1, kind="stable")[:, :k]
    return np.take_along_axis(x, order, -1), order


def check_softmax_add_topk(results: list, expected: list) -> None:
    """``results``: per input, the bytes of (softmax, add, topk values, topk indices) a
    framework computed; ``expected``: per input, reference arrays (softmax, add, values,
    indices) from NumPy or the framework's built-ins. Softmax within 1e-5 relative, the rest
    exact."""
    assert len(results) >= len(expected) > 0
    for (s, a, v, idx), (sm, add, vals, ids) in zip(results, expected):
        np.testing.assert_allclose(np.frombuffer(s, np.float32).reshape(sm.shape), sm, rtol=1e-5)
        np.testing.assert_array_equal(np.frombuffer(a, np.float32).reshape(add.shape), add)
        np.testing.assert_array_equal(np.frombuffer(idx, np.int64).reshape(ids.shape), ids)
        np.testing.assert_array_equal(np.frombuffer(v, np.float32).reshape(vals.shape), vals)


def assert_threads_bitwise_equal(single: list, work) -> None:
    """``work(thread_index)`` on every thread returns exactly the single-threaded ``single``."""
    for t, r in enumerate(run_threads(work)):
        assert r == single, f"thread {t} differs from the single-threaded run"
