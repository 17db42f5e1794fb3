"""Range reads whose first record is fetched in the background, on threads kept for the
process's next reads.

A seeded window starts the reads of all its blocks at once (up to 127). One thread per read
cost about 1 ms to start while the others ran (the new thread waits for the GIL before
``Thread.start`` returns), more than a local range read itself: 64 blocks of small shards spent
most of a window's start-up starting threads. The threads here are started once per process, as
reads need them, and kept: daemon threads, so a read stuck in its store's retries never holds up
the interpreter's exit. A forked child (a DataLoader worker) starts its own.
"""

from __future__ import annotations

import _thread
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Prefetch"]

# Threads a process keeps for prefetches: the reads one window starts at once, at most.
MOST_THREADS = 128


class _Threads:
    """Daemon threads running tasks from one queue, started as tasks find none idle."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # about the threads waiting for a task
        self._lock = threading.Lock()
        self._started = 0

    def submit(self, task: Callable[[], None]) -> None:
        self._tasks.put(task)
        if self._idle.acquire(blocking=False):
            return
        with self._lock:
            if self._started >= MOST_THREADS:
                return  # the task waits for the next thread that is done
            self._started += 1
        _thread.start_new_thread(self._run, ())

    def _run(self) -> None:
        while True:
            self._tasks.get()()
            self._idle.release()


_threads: _Threads | None = None
_threads_lock = threading.Lock()


def _forget_threads() -> None:
    """In a forked child: the parent's threads do not exist there, nor may its lock be free."""
    global _threads, _threads_lock
    _threads, _threads_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_threads)


def _process_threads() -> _Threads:
    global _threads
    with _threads_lock:
        if _threads is None:
            _threads = _Threads()
        return _threads


class Prefetch:
    """Iterates ``records``, whose first record a kept thread starts fetching at once.

    The store's reader releases the GIL while it waits, so the request overlaps the current
    range's decoding; an error surfaces when the records are reached, as without prefetch."""

    def __init__(self, records: Iterator[Any]) -> None:
        self._records = records
        self._first: list[Any] = []
        self._error: BaseException | None = None
        self._fetched = threading.Event()
        _process_threads().submit(self._prime)

    def _prime(self) -> None:
        try:
            self._first = [next(self._records)]
        except StopIteration:
            pass
        except BaseException as error:  # re-raised in the consumer
            self._error = error
        finally:
            self._fetched.set()

    def __iter__(self) -> Iterator[Any]:
        self._fetched.wait()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        yield from self._first
        yield from self._records
