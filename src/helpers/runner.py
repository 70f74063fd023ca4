"""A sweep's missing cells spread over Ray workers (`sweep.sweep(..., workers=N)`).

One actor per worker (one GPU each where the cluster has GPUs, else one CPU) takes cells from a
queue, one at a time; the driver alone writes the results store, one line per finished cell, in
the order they finish (the store is keyed, so order does not matter). An actor that dies (killed,
out of memory, its node lost) is replaced by a fresh one and its cell goes back to the front of
the queue; a cell that has killed `MAX_DEATHS` actors stops the run, naming it. A measurement
that raises stops the run with its own error, once the cells in flight are stored. An
interrupted run keeps what the store holds, so the next run computes only the rest.

Work sent to an actor is described by data: a cell (a dict of JSON values) and the name of a
measurement, a module-level function of a cell importable as "module:name", which loads its
model by name (`protocol.loading.model_for`: each actor process loads a model once and keeps
it). A closure over a loaded model cannot travel to another process, so one passed with
workers is refused before any work, with the fix. The actors live as long as the driver's
process (a chapter's second sweep reuses them and the models they hold).

Ray is imported only here and only when workers are asked for; it is the optional extra
`ray` (`pip install -e '.[ray]'`). Where no Ray cluster is running, `ray.init()` starts a local
one on this machine's CPUs and GPUs; to use a cluster, start it first (`ray start`, or
`ray.init(address=...)` before the run). A driver killed outright (kill -9) cannot stop the local
cluster it started, and Ray's agents outlive it; the next run names them, and `ray stop` ends them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import tempfile
from collections import deque
from pathlib import Path
from typing import Callable

from .errors import ConfigError
from .progress import bar, stream

MAX_DEATHS = (
    3  # a cell whose actor died this many times stops the run (it is likely the cause: memory)
)


def check_workers(workers) -> int | None:
    """`workers` as a count of Ray workers (None: in this process)."""
    if workers is None:
        return None
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(
            f"workers must be a number of Ray workers, at least 1 (None: run in this process), "
            f"got {workers!r}"
        )
    return workers


def check_workers_fit(workers) -> None:
    """Before any model loads: refuse `workers` above what the Ray cluster this run would start
    offers (one worker per GPU, else per CPU), where that is known without starting Ray: when no
    cluster is running (`ray.init()` then starts one on this machine) or Ray is already
    initialized. A running cluster is counted when the sweep connects (`_actors`)."""
    workers = check_workers(workers)
    if workers is None:
        return
    check_installed()
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        unit = "GPU" if "num_gpus" in _actor_options(ray) else "CPU"
        have, where = ray.cluster_resources().get(unit, 0), "the Ray cluster"
    elif (
        os.environ.get("RAY_ADDRESS")
        or Path(tempfile.gettempdir(), "ray", "ray_current_cluster").exists()
    ):
        return  # a cluster of its own size: counted once connected
    else:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        # At least Ray's own count (which also reads cgroup quotas), so nothing it would run is refused.
        unit, have = (
            ("GPU", gpus)
            if gpus
            else (
                "CPU",
                len(os.sched_getaffinity(0))
                if hasattr(os, "sched_getaffinity")
                else os.cpu_count() or 1,
            )
        )
        where = "this machine, where Ray would start its local cluster,"
    if workers > have:
        raise ConfigError(
            f"workers={workers}, but {where} has {have:g} {unit}s (one worker per {unit}): set "
            f"workers to at most {int(have)}, or start a larger cluster first (ray start)"
        )


def measurement_name(run) -> str:
    """The "module:name" of a measurement sent to workers: `run` itself when it is such a name of
    a function, else the name under which its module holds it. A closure, a lambda, a method or
    a partial is refused, with the fix."""
    if isinstance(run, str):
        measurement(run)  # importable, and a function
        return run
    module, qualname = getattr(run, "__module__", None), getattr(run, "__qualname__", None)
    found = None
    if module and qualname and "." not in qualname and "<" not in qualname:
        found = getattr(importlib.import_module(module), qualname, None)
    if found is not run or module == "__main__":
        what = f"{module}.{qualname}" if qualname else repr(run)
        raise ConfigError(
            f"a sweep run on workers needs its measurement as a module-level function of a cell (importable as "
            f"'module:name'), not {what}: a closure over a loaded model cannot be sent to another process. Move the "
            f"function to the top level of a module (not __main__), put everything it reads into the cell, and load "
            f"the model inside it by name (protocol.loading.model_for(cell['model'])); or leave workers=None to run "
            f"in this process"
        )
    return f"{module}:{qualname}"


def owner(run) -> str:
    """The "module:name" of the top-level function that holds `run` (a measurement, its
    "module:name", or a closure or lambda defined in a function): the code a store's version is
    cut from (`protocol.stores.open_store`'s `reads`)."""
    if isinstance(run, str):
        return run
    qualname = getattr(run, "__qualname__", None)
    if qualname is None:
        raise ConfigError(f"a store's measurement is a function of a cell, got {run!r}")
    return f"{run.__module__}:{qualname.partition('.')[0]}"


def measurement(name: str) -> Callable[[dict], dict]:
    """The function named "module:name"."""
    module, _, attr = name.partition(":") if isinstance(name, str) else ("", "", "")
    if not module or not attr:
        raise ConfigError(f"a measurement is named 'module:function', got {name!r}")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"measurement {name!r} cannot be imported ({e})") from None
    if not callable(found):
        raise ConfigError(f"measurement {name!r} is not a function")
    return found


def check_installed() -> None:
    """Stop now, with the install command, where Ray is not installed (found, not imported: fast)."""
    if importlib.util.find_spec("ray") is None:
        ray_module()


def ray_module():
    """Ray, imported now; where it is not installed, the error with the install command."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "workers= runs a sweep on Ray, which is not installed: pip install -e '.[ray]' "
            "(or leave workers=None to run in this process)"
        ) from None
    return ray


class Worker:
    """One actor: runs measurements by name; the models they load stay in its process."""

    def run(self, name: str, cell: dict) -> dict:
        return measurement(name)(cell)


_pool: list = []  # this process's actors, reused by its next sweep
_pool_options: dict = {}


def _actor_options(ray) -> dict:
    return {"num_gpus": 1} if ray.cluster_resources().get("GPU", 0) >= 1 else {"num_cpus": 1}


def _resources() -> dict:
    return {k: v for k, v in _pool_options.items() if k != "session"}


def _command(pid: str) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode(errors="replace")
            .strip()
        )
    except OSError:  # gone, or not Linux
        return ""


def leftovers() -> list[tuple[int, str]]:
    """This user's Ray processes left by a driver that was killed (kill -9 gives it no time to
    stop its local cluster): a `ray::` process (an agent, a worker) whose parent is neither a
    raylet nor another `ray::` process (a running cluster's own are the raylet's children, and
    what they start theirs). (pid, command) each; none where /proc is not there to read."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        command = _command(status.parent.name)
        if not command.startswith("ray::"):
            continue
        try:
            fields = dict(
                line.split(":", 1) for line in status.read_text().splitlines() if ":" in line
            )
            parent, uid = fields["PPid"].split()[0], int(fields["Uid"].split()[0])
        except (OSError, KeyError, ValueError, IndexError):
            continue
        parent_command = _command(parent)
        if (
            uid == os.getuid()
            and "raylet" not in parent_command
            and not parent_command.startswith("ray::")
        ):
            found.append((int(status.parent.name), command.split()[0]))
    return sorted(found)


def _actors(ray, n: int, asked: int) -> list:
    """`n` live actors, the pool's first, new ones started as needed; `asked`, the workers asked
    for, must fit the cluster (one device each)."""
    global _pool_options
    if not ray.is_initialized():
        if left := leftovers():
            print(
                f"Ray processes left by an earlier run that was killed ({', '.join(f'{p} {c}' for p, c in left)}) "
                f"are still running: `ray stop` ends them",
                file=stream() or sys.stderr,
                flush=True,
            )
        ray.init(include_dashboard=False)
    options = {**_actor_options(ray), "session": ray.get_runtime_context().get_job_id()}
    unit = "GPU" if "num_gpus" in options else "CPU"
    have = ray.cluster_resources().get(unit, 0)
    if asked > have:  # one device per actor: those beyond the cluster's would wait forever
        raise ConfigError(
            f"workers={asked}, but the Ray cluster has {have:g} {unit}s (one worker per {unit}): set "
            f"workers to at most {int(have)}, or add machines to the cluster (ray start)"
        )
    # another cluster (or device kind) than the pool's actors were started on
    if options != _pool_options:
        _pool.clear()
        _pool_options = options
    cls = ray.remote(**_resources())(Worker)
    while len(_pool) < n:
        _pool.append(cls.remote())
    return _pool[:n]


def _replace(ray, actors: list, slot: int) -> None:
    """A fresh actor in `slot` (of the pool too) for one that died."""
    fresh = ray.remote(**_resources())(Worker).remote()
    if actors[slot] in _pool:
        _pool[_pool.index(actors[slot])] = fresh
    actors[slot] = fresh


def shutdown() -> None:
    """Let go of this process's actors (a test's cluster ending, or a driver done with a run)."""
    if _pool:
        ray = ray_module()
        for actor in _pool:
            ray.kill(actor)
        _pool.clear()


def run_cells(
    cells: list[dict],
    name: str,
    workers: int,
    done: Callable[[dict, dict], None],
    desc: str = "sweep",
) -> None:
    """Compute every cell with the measurement `name` on `workers` Ray actors; `done(cell,
    result)` is called in this process for each, as it finishes. Where a measurement raises, no
    further cell starts, the cells in flight are finished and stored, then its error is raised
    here. If this process stops (an exception in `done`, Ctrl-C), the actors are let go, so the
    next run starts clean."""
    ray = ray_module()
    actors = _actors(ray, min(workers, len(cells)), workers)
    queue = deque(range(len(cells)))
    deaths = [0] * len(cells)
    pending: dict = {}  # object ref -> (actor slot, cell index)

    def submit(slot: int) -> None:
        i = queue.popleft()
        pending[actors[slot].run.remote(name, cells[i])] = (slot, i)

    failed = None  # a measurement's error: raised once the cells in flight are done and stored
    try:
        for slot in range(len(actors)):
            if queue:
                submit(slot)
        with bar(total=len(cells), desc=f"{desc} ({len(actors)} Ray workers)") as meter:
            while pending:
                [ref], _ = ray.wait(list(pending), num_returns=1)
                slot, i = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayActorError:  # the actor died, not the measurement
                    deaths[i] += 1
                    if deaths[i] >= MAX_DEATHS:
                        raise RuntimeError(
                            f"{desc}: cell {cells[i]} killed {deaths[i]} workers in a row (out of "
                            f"memory?); run it alone, or with fewer workers per device"
                        ) from None
                    _replace(ray, actors, slot)
                    if failed is None:
                        queue.appendleft(i)
                        submit(slot)
                    continue
                # the measurement raised: its own error, after the others
                except ray.exceptions.RayTaskError as e:
                    failed = failed or e
                    continue
                done(cells[i], result)
                meter.update(1)
                if queue and failed is None:
                    submit(slot)
    except BaseException:
        shutdown()  # actors still computing cells nobody will store
        raise
    if failed is not None:
        raise failed.as_instanceof_cause() from None
