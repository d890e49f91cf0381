"""A thread that works beside a `with` block: the emulator's helpers, the demo and the benchmarks each keep
something going (agents acting, another client spending the App's window, a sampler) while they run."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def in_background(work: Callable[[threading.Event], object], *, name: str) -> Iterator[None]:
    """Run `work(stop)` on a daemon thread while the block runs; once it ends, set `stop` and join the
    thread (`work` looks at `stop` between its rounds, e.g. waiting on it)."""
    stop = threading.Event()
    thread = threading.Thread(target=work, args=(stop,), name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
