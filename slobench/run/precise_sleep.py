"""Sleep to an absolute time with microsecond precision, without spinning: a Linux timerfd on the event loop.

asyncio's timers wake up to 1 ms late (epoll takes its timeout in whole milliseconds, rounded up), and
sleeping short then yielding until the time comes spends most of the client's CPU at 400 req/s polling
epoll. A timerfd armed for the exact deadline (CLOCK_MONOTONIC, which `time.perf_counter_ns` reads on
Linux) is an fd like any socket: epoll returns the moment it fires. One timerfd serves a loop's sleepers.
`sleep_until(clock, t_s, spin_s)` is what callers use; where there is no timerfd (not Linux, no libc
through ctypes, a perf_counter that is not CLOCK_MONOTONIC) it falls back to sleep-then-yield.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import heapq
import itertools
import math
import os
import sys
import time
import weakref

from slobench.run.clock import Clock

_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1
_TFD_FLAGS = os.O_NONBLOCK | os.O_CLOEXEC  # TFD_NONBLOCK and TFD_CLOEXEC are these flags on Linux


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    if "CLOCK_MONOTONIC" not in time.get_clock_info("perf_counter").implementation:
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.timerfd_settime.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _load_libc()
_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, PreciseSleep] = weakref.WeakKeyDictionary()


class PreciseSleep:
    """The sleeper of one event loop. `await until_ns(t)` returns once `time.perf_counter_ns() >= t`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, libc: ctypes.CDLL) -> None:
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_FLAGS)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self._fd = fd
        self._settime = libc.timerfd_settime
        self._spec = _Itimerspec()
        self._value = self._spec.it_value
        self._spec_ref = ctypes.byref(self._spec)
        self._unread = False  # it fired and nothing was due after: read it (or re-arm it) before the next wait
        self._loop = loop
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._armed_ns: int | None = None
        loop.add_reader(fd, self._fire)
        weakref.finalize(loop, os.close, fd)  # the fd lives as long as its loop

    @classmethod
    def for_running_loop(cls) -> PreciseSleep | None:
        if _LIBC is None:
            return None
        loop = asyncio.get_running_loop()
        sleeper = _BY_LOOP.get(loop)
        if sleeper is None or sleeper._loop.is_closed():
            try:
                sleeper = cls(loop, _LIBC)
            except (OSError, NotImplementedError):  # no timerfd, or a loop without add_reader
                return None
            _BY_LOOP[loop] = sleeper
        return sleeper

    async def until_ns(self, t_ns: int) -> None:
        if time.perf_counter_ns() >= t_ns:
            return
        fut: asyncio.Future[None] = self._loop.create_future()
        heapq.heappush(self._heap, (t_ns, next(self._seq), fut))
        if self._armed_ns is None or t_ns < self._armed_ns:
            self._arm(t_ns)
        await fut  # a cancelled sleep leaves its entry behind; _fire drops it

    def _arm(self, t_ns: int) -> None:
        """Set the timer (which also clears a past expiry: the fd is not readable until `t_ns`)."""
        value = self._value
        value.tv_sec, value.tv_nsec = divmod(t_ns, 1_000_000_000)
        if self._settime(self._fd, _TFD_TIMER_ABSTIME, self._spec_ref, None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self._armed_ns = t_ns
        self._unread = False

    def _fire(self) -> None:
        # The fd stays readable until its expiry count is read or the timer is set again. The sleeper woken
        # here mostly sleeps again (setting it) before the loop next polls, so a read waits for that poll:
        # one system call a sleep fewer. A call queued by a poll from before the timer was set again finds
        # nothing due and the timer set for the earliest sleeper: it does nothing.
        read = self._unread
        if read:
            self._unread = False
            try:
                os.read(self._fd, 8)
            except BlockingIOError:
                pass
        now = time.perf_counter_ns()
        heap = self._heap
        while heap and (heap[0][0] <= now or heap[0][2].done()):
            fut = heapq.heappop(heap)[2]
            if not fut.done():
                fut.set_result(None)
        armed = self._armed_ns
        expired = armed is not None and armed <= now
        if heap:
            if expired or heap[0][0] != armed:
                self._arm(heap[0][0])
        else:
            self._armed_ns = None
            self._unread = expired and not read


async def sleep_until(clock: Clock, t_s: float, spin_s: float) -> None:
    """Return once `clock.now_s() >= t_s`: on the loop's timerfd where there is one (and `clock` is a real
    `Clock`, whose readings are perf_counter's), else by sleeping to `spin_s` short of `t_s` and yielding
    to the loop the rest of the way. `spin_s == 0` asks for no precision: a plain asyncio sleep."""
    now = clock.now_s
    delay = t_s - now()
    if delay <= 0:
        return
    if spin_s > 0 and type(clock) is Clock:
        sleeper = PreciseSleep.for_running_loop()
        if sleeper is not None:
            await sleeper.until_ns(clock.origin_ns + math.ceil(t_s * 1e9))
            return
    if delay > spin_s:
        await asyncio.sleep(delay - spin_s)
    while now() < t_s:
        await asyncio.sleep(0)
