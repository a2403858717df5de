"""Run many episodes: in this process, in a process pool or on Ray (one task per job: an episode, or K cars driven
together), with a frames/s bar.

Used by `drive collect`, `drive dagger` and `drive eval`. Workers report frames through a shared counter
(`worker_tick`), so the bar moves during an episode, not only between them. Workers die with their parent (Linux
PR_SET_PDEATHSIG): a killed run leaves nothing writing behind it. `ray=ADDRESS` runs the same tasks on a Ray cluster
instead (drive/loop/ray_pool.py): one interface, two engines.

Ctrl-C: workers ignore SIGINT (a terminal sends it to the whole process group), so only the driver decides. The
driver's first SIGINT is noted and acted on between results, never half-way through `on_result` (which persists
them): results already finished are handed over, the tasks not started are dropped, the workers are killed (an
episode in flight is lost, and it is the only thing lost) and KeyboardInterrupt is raised, well within a second. A
second Ctrl-C raises at once.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from typing import Any

from drive.errors import USER_ERRORS
from drive.loop.heap import freeze_heap

_COUNTER: Any = None  # shared frame counter for the progress bar


def _init_worker(counter: Any) -> None:
    global _COUNTER
    _COUNTER = counter
    # Ctrl-C is the driver's to handle (see the module docstring): a worker that took it would report the episode as
    # failed and go on with the next task, so a stopped run kept recording behind the prompt
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform == "linux":  # die with the parent: a killed collect must not leave workers writing behind it
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    # one process per core: no library thread pools competing with the other workers. Modules a forked worker
    # inherits are set here; a spawned one imports them later, and they read these variables then (torch, BLAS:
    # OMP_NUM_THREADS; OpenCV: OPENCV_FOR_THREADS_NUM, else it started 2 threads per worker on 2 cores)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENCV_FOR_THREADS_NUM", "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    if "cv2" in sys.modules:
        sys.modules["cv2"].setNumThreads(1)


def worker_tick(n: int) -> None:
    if _COUNTER is not None and n:
        with _COUNTER.get_lock():
            _COUNTER.value += n


def _pool_context():
    """fork wherever it is safe. Every command imports torch before it starts the pool, so the old rule (fork only
    without torch) always spawned, and a spawned worker spent ~4 CPU-seconds importing torch, scipy, gymnasium and the
    task's modules again before its first episode; a forked one starts in 0.01 s with them (issue #26: 2-worker collect
    of 4 episodes 1.1x one worker with spawn, 2.0x with fork; on 2 busy shared cores the forked pool did 1.2-1.8x the
    spawned one's frames/s on 25-40 % less CPU). On Linux fork is safe with torch imported, even used: a worker runs
    torch on one thread (`_init_worker`), and a one-thread worker never enters the OpenMP pool it inherits (measured:
    a forked child running torch on 2 threads after its parent had used 2 hung in libgomp; on 1 thread it ran). Spawn
    stays for CUDA (a forked child cannot use the parent's context) and, with torch, off Linux (macOS frameworks)."""
    if "fork" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    torch = sys.modules.get("torch")
    if torch is None:
        return mp.get_context("fork")
    cuda = getattr(torch, "cuda", None)
    forkable = sys.platform == "linux" and not (cuda is not None and cuda.is_initialized())
    return mp.get_context("fork" if forkable else "spawn")


def run_tasks(
    fn: Callable[..., Any],
    tasks: list[tuple],
    workers: int,
    on_result: Callable[[Any], None],
    show: bool = True,
    label: str = "episodes",
    extra: tuple = (),
    ray: str | None = None,
    size: Callable[[tuple], int] | None = None,
) -> None:
    """Run `fn(*task, tick, *extra)` for each task, in this process (workers=1) or in a process pool, one task per
    job (in a worker `tick` is None: the worker reports frames through the shared counter); with `ray` (local, auto
    or a cluster address) as Ray tasks, `workers` of them in flight.

    `on_result` gets each result as it arrives (in completion order); `tick(n)` reports n more frames for the
    progress bar, `size(task)` how many episodes a task holds (default 1; K with K cars per process), which the
    bar counts. A failing task stops the run with an error naming the task; finished results were already handed
    over, so a caller that persists them in `on_result` loses nothing.
    """
    if not tasks:
        return
    weight = size or (lambda task: 1)
    total = sum(weight(t) for t in tasks)
    if ray is not None:
        from drive.loop.ray_pool import run_on_ray  # Ray is an optional extra: imported only when asked for

        run_on_ray(
            fn,
            tasks,
            workers,
            on_result,
            extra,
            ray,
            label,
            lambda counter: FrameProgress(total, counter, show, label),
            DeferredInterrupt(),
            weight,
        )
        return
    freeze_heap()
    if workers == 1 or len(tasks) == 1:
        _run_here(fn, tasks, on_result, show, label, extra, weight)  # Ctrl-C raises in the episode: nothing else runs
        return
    ctx = _pool_context()
    counter = ctx.Value("q", 0)
    n_done = 0
    pool = ProcessPoolExecutor(min(workers, len(tasks)), mp_context=ctx, initializer=_init_worker, initargs=(counter,))
    try:
        # submit (which starts the workers) before the progress bar starts its refresh thread: fork with one thread
        with _sigint_ignored(), _opencv_pool_stopped():  # inherited by the workers, even through spawn's exec: none
            pending = {pool.submit(fn, *task, None, *extra): task for task in tasks}  # dies of an early Ctrl-C
        with DeferredInterrupt() as interrupt, FrameProgress(total, counter, show, label) as bar:
            while pending and not interrupt.hit:
                complete, _ = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                for future in complete:
                    task = pending.pop(future)
                    on_result(_result(future, task, label))
                    n_done += weight(task)
                bar.update(n_done)
            if interrupt.hit:  # what finished before the Ctrl-C is kept; the rest is dropped below
                for future in [f for f in pending if f.done() and not f.cancelled() and f.exception() is None]:
                    on_result(future.result())
                raise KeyboardInterrupt
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown()


def check_ray(address: str | None) -> None:
    """Refuse a `ray` engine that cannot run before a command writes anything: Ray missing, or nothing listening at
    the cluster address (ray.init would retry for minutes)."""
    if address is not None:
        from drive.loop.ray_pool import probe  # Ray is an optional extra: imported only when asked for

        probe(address)


def _result(future: Future, task: tuple, label: str) -> Any:
    try:
        return future.result()
    except USER_ERRORS:
        raise  # bad input reported in a worker is still bad input: one line, no traceback
    except Exception as exc:
        raise RuntimeError(f"{label} task {task[-1]!r} failed: {exc}") from exc


def _stop(pool: ProcessPoolExecutor) -> None:
    """Drop the tasks not started and kill the workers, so nothing runs on after the caller gives up. An episode in
    flight is lost: its shard is written atomically (a killed write leaves a temp file the next run removes)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # the stdlib has no public kill before 3.14
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.kill()
    for process in processes:
        process.join(timeout=5)
    if manager is not None:  # let it finish closing its wake-up pipe: CPython 3.11's exit hook writes to that pipe
        manager.join(timeout=5)  # unlocked, and a close racing it printed an OSError traceback after Ctrl-C


@contextmanager
def _opencv_pool_stopped() -> Iterator[None]:
    """OpenCV on one thread while the workers fork, the parent's setting back after. A child forked while the
    parent's OpenCV thread pool exists (any large parallel cv2 call starts it) hangs for ever in its first
    `cv2.setNumThreads`, which `_init_worker` calls (tests/drive/loop/test_pool.py reproduces it: a parent's
    cvtColor, half a second, then the pool)."""
    cv2 = sys.modules.get("cv2")
    threads = cv2.getNumThreads() if cv2 is not None else 1
    if cv2 is not None and threads != 1:
        cv2.setNumThreads(1)
    try:
        yield
    finally:
        if cv2 is not None and threads != 1:
            cv2.setNumThreads(threads)


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield  # signals can only be set in the main thread; None: a handler Python cannot restore
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class DeferredInterrupt:
    """While active (in the main thread, with Python's default SIGINT handler), the first SIGINT only sets `hit`, which
    the driver loop checks between results; a second one raises KeyboardInterrupt at once."""

    def __init__(self) -> None:
        self.hit = False
        self._previous: Any = None

    def __enter__(self) -> DeferredInterrupt:
        in_main = threading.current_thread() is threading.main_thread()
        if in_main and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _run_here(
    fn: Callable[..., Any],
    tasks: list[tuple],
    on_result: Callable[[Any], None],
    show: bool,
    label: str,
    extra: tuple,
    weight: Callable[[tuple], int],
) -> None:
    counter = mp.Value("q", 0, lock=False)
    done = 0

    def tick(n: int) -> None:
        counter.value += n
        bar.update(done)

    with FrameProgress(sum(weight(t) for t in tasks), counter, show, label) as bar:
        for task in tasks:
            on_result(fn(*task, tick, *extra))
            done += weight(task)
            bar.update(done)


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
