"""Run many episodes: in this process, in a process pool or on Ray (one episode per task), with a frames/s bar.

Used by `drive collect` and `drive eval`. Workers report frames through a shared counter (`worker_tick`), so the bar
moves during an episode, not only between them. Workers die with their parent (Linux PR_SET_PDEATHSIG): a killed
run leaves nothing writing behind it. `ray=ADDRESS` runs the same tasks on a Ray cluster instead
(drive/loop/ray_pool.py): one interface, two engines.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

from drive.errors import USER_ERRORS

_COUNTER: Any = None  # shared frame counter for the progress bar


def _init_worker(counter: Any) -> None:
    global _COUNTER
    _COUNTER = counter
    if sys.platform == "linux":  # die with the parent: a killed collect must not leave workers writing behind it
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    # one process per core: no library thread pools competing with the other workers
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    if "cv2" in sys.modules:
        sys.modules["cv2"].setNumThreads(1)


def worker_tick(n: int) -> None:
    if _COUNTER is not None and n:
        with _COUNTER.get_lock():
            _COUNTER.value += n


def _pool_context():
    # fork is fast (workers inherit imports) and safe while this process holds no torch thread pool; otherwise spawn.
    methods = mp.get_all_start_methods()
    return mp.get_context("fork" if "fork" in methods and "torch" not in sys.modules else "spawn")


def run_tasks(
    fn: Callable[..., Any],
    tasks: list[tuple],
    workers: int,
    on_result: Callable[[Any], None],
    show: bool = True,
    label: str = "episodes",
    extra: tuple = (),
    ray: str | None = None,
) -> None:
    """Run `fn(*task, tick, *extra)` for each task, in this process (workers=1) or in a process pool, one task per
    job (in a worker `tick` is None: the worker reports frames through the shared counter); with `ray` (local, auto
    or a cluster address) as Ray tasks, `workers` of them in flight.

    `on_result` gets each result as it arrives (in completion order); `tick(n)` reports n more frames for the
    progress bar. A failing task stops the run with an error naming the task; finished results were already handed
    over, so a caller that persists them in `on_result` loses nothing.
    """
    if not tasks:
        return
    if ray is not None:
        from drive.loop.ray_pool import run_on_ray  # Ray is an optional extra: imported only when asked for

        run_on_ray(fn, tasks, workers, on_result, extra, ray, label,
                   lambda counter: FrameProgress(len(tasks), counter, show, label))  # fmt: skip
        return
    if workers == 1 or len(tasks) == 1:
        _run_here(fn, tasks, on_result, show, label, extra)
        return
    ctx = _pool_context()
    counter = ctx.Value("q", 0)
    n_done = 0
    pool = ProcessPoolExecutor(min(workers, len(tasks)), mp_context=ctx, initializer=_init_worker, initargs=(counter,))
    try:
        # submit (which starts the workers) before the progress bar starts its refresh thread: fork with one thread
        pending = {pool.submit(fn, *task, None, *extra): task for task in tasks}
        with FrameProgress(len(tasks), counter, show, label) as bar:
            while pending:
                complete, _ = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                for future in complete:
                    task = pending.pop(future)
                    try:
                        result = future.result()
                    except USER_ERRORS:
                        raise  # bad input reported in a worker is still bad input: one line, no traceback
                    except Exception as exc:
                        raise RuntimeError(f"{label} task {task[-1]!r} failed: {exc}") from exc
                    n_done += 1
                    on_result(result)
                bar.update(n_done)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def _run_here(fn: Callable[..., Any], tasks: list[tuple], on_result: Callable[[Any], None], show: bool, label: str,
              extra: tuple) -> None:  # fmt: skip
    counter = mp.Value("q", 0, lock=False)
    results: list = []

    def tick(n: int) -> None:
        counter.value += n
        bar.update(len(results))

    with FrameProgress(len(tasks), counter, show, label) as bar:
        for task in tasks:
            results.append(fn(*task, tick, *extra))
            on_result(results[-1])
            bar.update(len(results))


class FrameProgress:
    """A rich progress bar over episodes with a frames and frames/s readout read from a shared frame counter."""

    def __init__(self, n_episodes: int, counter: Any, show: bool = True, label: str = "collect"):
        self.n_episodes, self.counter, self.show, self.label = n_episodes, counter, show, label
        self.start = self.last = time.perf_counter()

    def __enter__(self) -> FrameProgress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.start = time.perf_counter()
        self.bar = Progress(
            TextColumn(self.label),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("episodes"),
            TextColumn("{task.fields[frames]} frames, {task.fields[fps]} frames/s"),
            TimeElapsedColumn(),
            disable=not self.show,
        )
        self.bar.start()
        self.task = self.bar.add_task("collect", total=self.n_episodes, frames=0, fps="-")
        return self

    def update(self, n_finished: int) -> None:
        now = time.perf_counter()
        if now - self.last < 0.2 and n_finished < self.n_episodes:
            return
        self.last = now
        frames = int(self.counter.value)
        fps = f"{frames / (now - self.start):.0f}" if now > self.start else "-"
        self.bar.update(self.task, completed=n_finished, frames=frames, fps=fps)

    def __exit__(self, *exc) -> None:
        self.last = 0.0
        self.bar.stop()


class Ticker:
    """Observer that reports frames to a progress counter every `every` steps (and the remainder at episode end)."""

    def __init__(self, tick: Callable[[int], None] | None = None, every: int = 16):
        self.tick, self.every = tick or worker_tick, every

    def __call__(self, rec: Any) -> None:
        if (rec.t + 1) % self.every == 0:
            self.tick(self.every)
        elif rec.terminated or rec.truncated:
            self.tick((rec.t + 1) % self.every)
