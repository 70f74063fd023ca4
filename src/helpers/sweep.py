"""Resumable sweeps: every finished cell of a sweep is appended to a JSON-lines file at once
(flushed and fsynced), so an interrupted sweep, run again, computes only what is missing.

A process killed in the middle of a write leaves an incomplete last line. Opening the store
finds it, moves it to `<file>.torn` (kept, never deleted), cuts the file back to its last
complete line and says so in a warning; that cell is computed again, and records go on being
appended one per line. Lines that are not records (left by older code) are moved aside the
same way.

One process writes a store at a time: `lock` holds the lock file `<file>.lock` (an OS lock,
`fcntl.flock`, let go by the OS when its process dies, even by kill -9). Opening a store and
running a sweep take it; a second process that finds it taken says who holds it (pid, host,
command, since when) on the progress stream, waits, then re-reads the store, so it reuses the
cells the first one finished instead of computing them again. Torn lines are repaired only under
the lock, so no process cuts a line that another is still writing. Within a process the lock is
re-entrant (opening a store inside a sweep of the same store does not wait for itself); a sweep
spread over Ray workers (`sweep(..., workers=N)`, `runner`) writes from the driver alone. What
the operating system refuses (a full disk, a results path that is a file) comes back as a
StoreError naming the file and GA_RESULTS, and a write cut short by it is cut back off, so the
next run resumes. A store in a folder this process cannot write (a read-only disk, another user's
results) is read as it is, under a shared lock or none, and only a cell it lacks stops the run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Callable, Iterable

from . import runner
from .errors import StoreError
from .progress import bar, stream


def os_error(path: Path | str, doing: str, error: OSError) -> StoreError:
    """The StoreError for what the operating system refused while `doing` something to `path`,
    with the fixes (the folder comes from GA_RESULTS)."""
    folder = os.environ.get("GA_RESULTS")
    where = f"GA_RESULTS={folder}" if folder else "GA_RESULTS is unset: ./results"
    why = error.strerror or str(error)
    if isinstance(error, (FileExistsError, NotADirectoryError)):
        file = next((p for p in Path(path).parents if p.exists() and not p.is_dir()), None)
        why = f"{file} is a file, not a folder" if file else why
    if isinstance(error, IsADirectoryError):
        return StoreError(f"{path}: cannot {doing} (it is a folder, not a file): move it away")
    return StoreError(
        f"{path}: cannot {doing} ({why}): free disk space or make the folder "
        f"writable, or set GA_RESULTS to a writable folder ({where})"
    )


# --- one writer at a time ------------------------------------------------------------------------

# absolute store path -> [lock file descriptor, depth, writable] while held here
_held: dict[str, list] = {}
_thread_locks: dict[str, threading.RLock] = {}
_guard = threading.Lock()


def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def _try_lock(fd: int, kind: int = fcntl.LOCK_EX) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _holder(fd: int) -> str | None:
    """Who holds the lock, as its holder wrote it into the lock file (None: not written yet)."""
    try:
        info = json.loads(os.pread(fd, 4096, 0))
        return (
            f"pid {info['pid']} on {info['host']} ({info['command']}), since "
            f"{time.strftime('%H:%M:%S', time.localtime(info['since']))}"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _open_lock(path: Path) -> tuple[int | None, bool]:
    """The lock file's descriptor and whether this process may write the store. Where the folder
    is read-only to it (a read-only disk, another user's results), the store can still be read:
    under a shared lock on the lock file if there is one (a writer elsewhere finishes its line
    first), else with none (nothing can write here)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(path.parent, os.W_OK):  # a repair or a record could not be written
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        return os.open(_lock_path(path), os.O_RDWR | os.O_CREAT, 0o644), True
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or not path.parent.is_dir():
            raise os_error(_lock_path(path), "create the store's lock file", e) from None
        try:
            return os.open(_lock_path(path), os.O_RDONLY), False
        except FileNotFoundError:
            return None, False
        except OSError as e:
            raise os_error(_lock_path(path), "open the store's lock file", e) from None


def read_only(path: Path) -> StoreError:
    return StoreError(
        f"{path}: cannot add a record: this process cannot write its folder or its lock file "
        f"({_lock_path(path).name}); make them writable, or set GA_RESULTS to a writable folder (the "
        f"finished cells of a store it can only read are read as they are)"
    )


def writable(path: Path | str) -> bool:
    """Whether this process, holding the store's lock, may write the store at `path`."""
    return _held[os.path.abspath(path)][2]


def _check_lock_file(path: Path, fd: int) -> None:
    """The lock held through `fd` is the one on disk. A lock file deleted (or replaced) while
    held lets a second process take a fresh one and write beside this one: stop, naming it."""
    try:
        same = os.stat(_lock_path(path)).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        same = False
    if not same:
        raise StoreError(
            f"{_lock_path(path)}, the lock of the results store {path}, was deleted or replaced while "
            f"this process held it, so another process may be writing the store too: stop the other "
            f"runs of this chapter and run it again (finished cells are kept); never delete a .lock "
            f"file while a chapter runs"
        )


@contextlib.contextmanager
def lock(path: Path | str):
    """Hold the store at `path` for the block: the only writer until the block ends. If another
    process holds it, say who and wait."""
    path = Path(path)
    key = os.path.abspath(path)
    with _guard:
        thread_lock = _thread_locks.setdefault(key, threading.RLock())
    with thread_lock:
        if key in _held:  # this process holds it already
            _held[key][1] += 1
            try:
                yield
            finally:
                _held[key][1] -= 1
            return
        fd, may_write = _open_lock(path)
        if not may_write:  # read only: no writer's line is cut short under a shared lock
            try:
                if fd is not None and not _try_lock(fd, fcntl.LOCK_SH):
                    print(
                        f"{path} is being written by {_holder(fd) or 'another process'}: waiting to read it",
                        file=stream() or sys.stderr,
                        flush=True,
                    )
                    fcntl.flock(fd, fcntl.LOCK_SH)
                _held[key] = [fd, 1, False]
                try:
                    yield
                finally:
                    del _held[key]
            finally:
                if fd is not None:
                    os.close(fd)
            return
        try:
            if not _try_lock(fd):
                holder = _holder(fd)
                # a holder that has just taken the lock writes its name in a moment
                for _ in range(20):
                    if holder is not None or _try_lock(fd):
                        break
                    time.sleep(0.05)
                    holder = _holder(fd)
                else:
                    holder = "another process (it has not said which)"
                if holder is not None:
                    out = stream() or sys.stderr
                    print(
                        f"{path} is being written by {holder}: waiting for it to finish "
                        f"(the cells it finishes will not be computed again)",
                        file=out,
                        flush=True,
                    )
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    print(f"{path}: the other writer is done; going on", file=out, flush=True)
            _check_lock_file(path, fd)
            try:  # who holds it, for a process that comes to wait (informative only: a full disk may refuse it)
                me = json.dumps(
                    {
                        "pid": os.getpid(),
                        "host": socket.gethostname(),
                        "since": time.time(),
                        "command": " ".join(sys.argv)[:200] or sys.executable,
                    }
                ).encode()
                os.pwrite(fd, me, 0)
                os.ftruncate(fd, len(me))
            except OSError:
                pass
            _held[key] = [fd, 1, True]
            try:
                yield
            finally:
                del _held[key]
        finally:
            os.close(fd)  # lets go of the lock


def _plain(value):
    """JSON for the numpy and torch scalars a cell or result often holds (np.int64(16), a 0-d
    tensor): their Python value, so that they key and read back as the plain numbers do."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def _key(cell: Mapping) -> str:
    if not isinstance(cell, Mapping):
        raise StoreError(f"a sweep cell is a dict of its settings, got {cell!r}")
    try:
        return json.dumps(dict(cell), sort_keys=True, default=_plain)
    except (TypeError, ValueError) as e:
        raise StoreError(
            f"cell {cell!r}: its settings must be JSON values with text keys ({e})"
        ) from None


def _line(cell: Mapping, result: Mapping) -> bytes:
    """One record, serialised whole before anything is written."""
    _key(cell)
    if not isinstance(result, Mapping):
        raise StoreError(
            f"cell {dict(cell)!r}: a result is a dict (its row merges it into the cell's settings), "
            f"got {type(result).__name__}"
        )
    try:
        return (
            json.dumps({"cell": dict(cell), "result": dict(result)}, default=_plain) + "\n"
        ).encode()
    except (TypeError, ValueError) as e:
        raise StoreError(f"cell {dict(cell)!r}: its result must hold JSON values ({e})") from None


def _record(line: bytes) -> dict | None:
    """The record on a line, or None if the line is not one."""
    try:
        row = json.loads(line)
    except ValueError:  # includes a cut multi-byte character (UnicodeDecodeError)
        return None
    if (
        isinstance(row, dict)
        and row.keys() == {"cell", "result"}
        and all(isinstance(v, dict) for v in row.values())
    ):
        return row
    return None


def _fsync_append(path: Path, data: bytes) -> None:
    """Append `data` and wait until it is on disk. A write that fails or is interrupted part-way
    (Ctrl-C, a full disk) is cut back off, so this process never leaves a fragment behind."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            rest = memoryview(data)
            while rest:
                rest = rest[os.write(fd, rest) :]
            os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


TORN_KEPT = 3  # set-aside lines a store's .torn file keeps, the newest


def _write_lines(path: Path, lines: list[bytes]) -> None:
    """`path` holding only these lines, swapped in whole (a crash leaves the old or the new)."""
    fresh = path.with_name(path.name + ".rewrite")
    with fresh.open("wb") as f:
        f.write(b"".join(line + b"\n" for line in lines))
        f.flush()
        os.fsync(f.fileno())
    os.replace(fresh, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself on disk
    finally:
        os.close(folder)


class Store:
    """A dict from a sweep cell (a JSON-able dict of its settings) to its result (a JSON-able
    dict), backed by an append-only JSON-lines file. A result reads back as it was written to
    the file, so a fresh run and a resumed one return equal rows. `reads`: the measurements
    ("module:name", `runner.owner`) whose code the file's name is versioned by, the only ones
    `sweep` lets fill it (empty: any)."""

    def __init__(self, path: Path | str, reads: Iterable[str] = ()):
        self.path = Path(path)
        self.reads = frozenset(reads)
        self.torn = self.path.with_name(self.path.name + ".torn")
        self._done: dict[str, dict] = {}
        self._seen: tuple | None = None  # the file as this process last read or wrote it
        with self.lock():
            self.refresh()

    def lock(self):
        """Hold this store for a block (see `lock`)."""
        return lock(self.path)

    def _stat(self) -> tuple | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def refresh(self) -> None:
        """Read what other processes wrote since this one last looked. Call it holding the lock."""
        try:
            if self._stat() != self._seen:
                self._done.clear()
                if self.path.exists():
                    self._load()
                self._seen = self._stat()
        except OSError as e:
            raise os_error(self.path, "read or repair the results store", e) from None

    def _load(self) -> None:
        data = self.path.read_bytes()
        cut = data.rfind(b"\n") + 1
        lines, tail = data[:cut].split(b"\n")[:-1], data[cut:]  # tail: after the last newline
        if tail and _record(tail) is not None:  # a whole record that lost only its newline
            if writable(self.path):
                _fsync_append(self.path, b"\n")
            lines, tail = lines + [tail], b""
        rows = [_record(line) for line in lines]
        for row in rows:
            if row is not None:
                self._done[_key(row["cell"])] = row["result"]
        bad = [line for line, row in zip(lines, rows) if row is None]
        if (bad or tail) and not writable(self.path):
            warnings.warn(
                f"{self.path}: {len(bad) + bool(tail)} incomplete or unreadable line(s) skipped (the store "
                f"is read-only here, so they stay); their cells are missing",
                RuntimeWarning,
                stacklevel=4,
            )
        elif bad:
            kept = [line for line, row in zip(lines, rows) if row is not None]
            self._set_aside(bad + [tail] if tail else bad, lambda: self._rewrite(kept))
        elif tail:
            self._set_aside([tail], lambda: self._truncate(cut))

    def _set_aside(self, lines: list[bytes], repair: Callable[[], None]) -> None:
        """Copy lines that are not records to the `.torn` file, which keeps the last `TORN_KEPT`
        (a record can be megabytes: kept all, sixteen kills left 229 MB), then `repair` the store.
        In this order a crash in between loses nothing (the next open copies them a second time)."""
        try:
            if self.torn.is_dir():
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
            old = self.torn.read_bytes().split(b"\n")[:-1] if self.torn.exists() else []
            _write_lines(self.torn, (old + lines)[-TORN_KEPT:])
        except OSError as e:
            raise os_error(self.torn, "set the store's torn lines aside", e) from None
        repair()
        warnings.warn(
            f"{self.path}: {len(lines)} incomplete or unreadable line(s) ({sum(map(len, lines)):,} bytes), "
            f"left by an interrupted write, moved to {self.torn} (it keeps the last {TORN_KEPT}, "
            f"{self.torn.stat().st_size:,} bytes now); their cells will be computed again",
            RuntimeWarning,
            stacklevel=4,
        )

    def _truncate(self, size: int) -> None:
        with self.path.open("r+b") as f:
            f.truncate(size)
            os.fsync(f.fileno())

    def _rewrite(self, lines: list[bytes]) -> None:
        _write_lines(self.path, lines)

    def __contains__(self, cell: dict) -> bool:
        return _key(cell) in self._done

    def __getitem__(self, cell: dict) -> dict:
        return self._done[_key(cell)]

    def __len__(self) -> int:
        return len(self._done)

    def cells(self) -> list[dict]:
        """The settings of every cell the store holds."""
        return [json.loads(key) for key in self._done]

    def put(self, cell: dict, result: dict) -> None:
        """Record a cell's result: on disk (flushed and fsynced) before it counts as done."""
        line = _line(cell, result)
        with self.lock():
            if not writable(self.path):
                raise read_only(self.path)
            _check_lock_file(self.path, _held[os.path.abspath(self.path)][0])
            self.refresh()
            # another process wrote it since this one last looked: keep theirs
            if _key(cell) in self._done:
                return
            try:
                _fsync_append(self.path, line)
            except OSError as e:
                raise os_error(self.path, "append a record to the results store", e) from None
            self._seen = self._stat()
        row = json.loads(line)
        self._done[_key(row["cell"])] = row["result"]


def sweep(
    store: Store,
    cells: Iterable[dict],
    run: Callable[[dict], dict] | str,
    desc: str = "sweep",
    workers: int | None = None,
) -> list[dict]:
    """Results for every cell, in order, computing (with a progress bar) only the missing ones,
    each once. Each returned row is the cell's settings merged with its result.

    `workers`: None computes in this process; N >= 1 spreads the missing cells over N Ray workers
    (`runner`), and `run` must then be a measurement that can travel: a module-level function of
    a cell (or its "module:name"), which loads its model by name; this process writes the store."""
    if not isinstance(store, Store):
        raise StoreError(f"sweep's first argument is a Store, got {type(store).__name__}")
    workers = runner.check_workers(workers)
    if workers is not None:
        # before anything runs: a closure is refused with the fix
        name = runner.measurement_name(run)
    elif not callable(run):
        raise StoreError(f"sweep's run is a function of a cell, got {run!r}")
    if store.reads and runner.owner(run) not in store.reads:
        raise StoreError(
            f"{store.path.name} is versioned by the code of {', '.join(sorted(store.reads))}, "
            f"not {runner.owner(run)}, which would fill it: name it in open_store's reads"
        )
    cells = list(cells)
    keys = [_key(c) for c in cells]  # every cell checked before the first runs
    # the only writer: another process running this sweep waits, then reuses these cells
    with store.lock():
        store.refresh()
        todo = {key: c for key, c in zip(keys, cells) if key not in store._done}
        if todo and not writable(store.path):  # before any cell is computed
            raise read_only(store.path)
        if workers is not None and todo:
            runner.run_cells(
                list(todo.values()),
                name,
                workers,
                store.put,
                desc=f"{desc} ({len(cells) - len(todo)} cached)",
            )
        else:
            for cell in bar(
                list(todo.values()),
                desc=f"{desc} ({len(cells) - len(todo)} cached)",
                disable=not todo,
            ):
                store.put(cell, run(cell))
        return [{**c, **store[c]} for c in cells]
