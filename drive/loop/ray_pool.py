"""The Ray engine of `run_tasks` (drive/loop/pool.py): one Ray task per episode, on a local Ray instance or a cluster.

    run_tasks(fn, tasks, workers, on_result, ray="local")         # a Ray instance in this process, `workers` CPUs
    run_tasks(fn, tasks, workers, on_result, ray="auto")          # the cluster `ray start` made on this node
    run_tasks(fn, tasks, workers, on_result, ray="HOST:6379")     # any Ray cluster (ray.init's address)

The same contract as the process pool: `fn(*task, tick, *extra)` runs once per task, `on_result` gets each result
in this process as it arrives (so what the caller persists there, a manifest, is written by the driver alone), and a
failing task stops the run with an error naming it. `workers` is the number of tasks in flight (with `local`, also
the CPUs of the Ray instance started here). A task whose worker process dies (killed, out of memory, node lost) is
run again by Ray on another worker (`max_retries`); an exception raised by the task itself is not retried: a bug
or bad input would only fail again. Workers report frames to a counter actor, which the driver's progress bar reads.

Tasks write their own outputs (collect: the episode shard, atomically): on a multi-node cluster the output folder
must be on a filesystem every node mounts at the same path, and every node needs the same `drive` install.
Ray is the `distributed` extra; the import happens only when a run asks for it.

An address where nothing listens is refused in seconds, by a TCP connect to it before `ray.init` (which would retry
for minutes, printing warnings). Ctrl-C stops the run as the process pool does (drive/loop/pool.py): finished
results handed over, the tasks in flight cancelled (their workers killed), KeyboardInterrupt raised.
"""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from drive.errors import USER_ERRORS, UserError

log = logging.getLogger(__name__)

MAX_RETRIES = 3  # runs of a task whose worker died before the run gives up (Ray's own default)
LOCAL_OBJECT_STORE = 128 * 2**20  # results are episode records, not frames: a small store spares a shared machine
PROBE_SECONDS = 3.0  # a listening Ray head accepts a TCP connect in milliseconds, even across a data centre


def _ray():
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray: pip install 'ray==2.60.0' (the `distributed` extra)") from None
    return ray


def connect(address: str, workers: int) -> bool:
    """Join (or start, for `local`) a Ray cluster; True when this call started it and so must shut it down."""
    ray = _ray()
    if ray.is_initialized():
        return False  # a caller (a test, a notebook) already chose the cluster: use it as it is
    quiet = {"log_to_driver": False, "logging_level": logging.ERROR, "include_dashboard": False}
    probe(address)
    try:
        if address == "local":
            ray.init(num_cpus=workers, object_store_memory=LOCAL_OBJECT_STORE, **quiet)
        else:
            ray.init(address=address, **quiet)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise _unreachable(address, exc) from None
    return True


def _unreachable(address: str, exc: BaseException) -> UserError:
    return UserError(f"--ray {address}: cannot reach a Ray cluster ({' '.join(str(exc).split())[:200]})")


def probe(address: str) -> None:
    """A UserError unless Ray is installed and, for a cluster, something accepts a TCP connection where
    `ray.init(address)` will dial (auto: the cluster `ray start` recorded on this node, when there is one)."""
    ray = _ray()
    if address == "local" or ("://" in address and not address.startswith("ray://")):
        return  # local: started here; another client protocol: Ray's own checks apply
    target = address.removeprefix("ray://")
    if target == address:  # a cluster (GCS) address: ray.init dials a loopback host on this node's own IP
        try:
            target = ray._private.services.canonicalize_bootstrap_address(address) or address
        except (ConnectionError, ValueError) as exc:  # `auto` without a cluster, a malformed address
            raise _unreachable(address, exc) from None
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--ray {address}: expected local, auto, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_SECONDS).close()
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or type(exc).__name__
        raise UserError(
            f"--ray {address}: no Ray cluster answers at {target} ({reason}); start one there with "
            "`ray start --head`, or run on this machine with --ray local"
        ) from None


def _remote_task():
    ray = _ray()

    @ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)
    def run_one(fn: Callable[..., Any], task: tuple, extra: tuple, frames: Any) -> Any:
        if "torch" in sys.modules:  # one thread per task, as in the process pool
            sys.modules["torch"].set_num_threads(1)
        return fn(*task, lambda n: frames.add.remote(n) if n else None, *extra)

    return run_one


def _frame_counter():
    ray = _ray()

    @ray.remote(num_cpus=0)
    class Frames:
        """Frames finished across all workers (fire-and-forget `add` from the tasks; the driver polls `value`)."""

        def __init__(self) -> None:
            self.n = 0

        def add(self, n: int) -> None:
            self.n += n

        def value(self) -> int:
            return self.n

    return Frames.remote()


class _Polled:
    """`.value` of the counter actor, as the progress bar reads a shared counter (a stale value while one is due)."""

    def __init__(self, actor: Any) -> None:
        self.actor, self.pending, self.last = actor, None, 0

    @property
    def value(self) -> int:
        ray = _ray()
        if self.pending is None:
            self.pending = self.actor.value.remote()
        ready, _ = ray.wait([self.pending], timeout=0)
        if ready:
            self.last, self.pending = ray.get(ready[0]), None
        return self.last


def run_on_ray(
    fn: Callable[..., Any],
    tasks: list[tuple],
    workers: int,
    on_result: Callable[[Any], None],
    extra: tuple,
    address: str,
    label: str,
    progress: Callable[[Any], AbstractContextManager],
    interrupt: Any,
    weight: Callable[[tuple], int] = lambda task: 1,
) -> None:
    """`run_tasks` on Ray; `progress(counter)` is the driver's progress bar over a counter with `.value`;
    `interrupt` (drive/loop/pool.py's DeferredInterrupt), while entered, turns a first Ctrl-C into `interrupt.hit`."""
    ray = _ray()
    started = connect(address, workers)
    pending: dict[Any, tuple] = {}
    try:
        run_one, frames = _remote_task(), _frame_counter()
        fn_ref, extra_ref = ray.put(fn), ray.put(extra)
        queue = list(tasks)
        n_done = 0
        counter = _Polled(frames)
        with interrupt, progress(counter) as bar:
            while (queue or pending) and not interrupt.hit:
                while queue and len(pending) < workers:
                    task = queue.pop(0)
                    pending[run_one.remote(fn_ref, task, extra_ref, frames)] = task
                done, _ = ray.wait(list(pending), num_returns=1, timeout=0.25)
                for ref in done:
                    task = pending.pop(ref)
                    on_result(_result(ray, ref, task, label))
                    n_done += weight(task)
                bar.update(n_done)
            if interrupt.hit:  # what finished before the Ctrl-C is kept; the tasks in flight are cancelled below
                done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0) if pending else ([], [])
                for ref in done:
                    try:
                        result = _result(ray, ref, pending.pop(ref), label)
                    except Exception:
                        continue  # a task that failed as the run stopped: the interrupt is what is reported
                    on_result(result)
                raise KeyboardInterrupt
            counter.last = ray.get(frames.value.remote())  # the final count, not the last poll
            bar.update(n_done)
        ray.kill(frames)
    except BaseException:
        for ref in pending:  # a failed or interrupted run leaves nothing running behind it
            ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()


def _result(ray: Any, ref: Any, task: tuple, label: str) -> Any:
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if isinstance(exc.cause, BaseException) else exc
        if isinstance(cause, USER_ERRORS):
            raise cause from None  # bad input reported in a worker is still bad input: one line, no traceback
        raise RuntimeError(f"{label} task {task[-1]!r} failed on a Ray worker: {cause}") from cause
    except ray.exceptions.RayError as exc:  # worker or node lost more often than MAX_RETRIES allows
        raise RuntimeError(f"{label} task {task[-1]!r} lost after {MAX_RETRIES} retries: {exc}") from exc
