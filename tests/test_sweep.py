import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import helpers.sweep
from helpers.errors import StoreError
from helpers.sweep import Store, sweep


def lines(path):
    """Every line of the file, each parsed (fails if one is not JSON)."""
    return [json.loads(line) for line in path.read_bytes().split(b"\n")[:-1]]


def test_interrupted_sweep_resumes_without_recomputing(tmp_path):
    calls = []

    def run(cell):
        calls.append(cell["x"])
        if cell["x"] == 3 and len(calls) == 4:
            raise KeyboardInterrupt
        return {"y": cell["x"] ** 2}

    cells = [{"x": x} for x in range(6)]
    store = Store(tmp_path / "s.jsonl")
    with pytest.raises(KeyboardInterrupt):
        sweep(store, cells, run)
    assert calls == [0, 1, 2, 3]
    rows = sweep(Store(tmp_path / "s.jsonl"), cells, run)  # a new process would reopen the file
    assert calls == [0, 1, 2, 3, 3, 4, 5]
    assert [r["y"] for r in rows] == [x * x for x in range(6)]
    assert sweep(Store(tmp_path / "s.jsonl"), cells, run) == rows and len(calls) == 7


def test_a_torn_last_line_is_moved_aside_and_the_next_record_starts_a_fresh_line(tmp_path):
    """The issue's repro: the resumed run used to append its record onto the fragment, so the
    cell it finished read back as missing, on this and every later resume."""
    path = tmp_path / "s.jsonl"
    Store(path).put({"x": 1}, {"y": 1})
    with path.open("a") as f:
        f.write('{"cell": {"x": 2}, "res')
    with pytest.warns(RuntimeWarning, match=r"1 incomplete .* moved to .*s\.jsonl\.torn"):
        store = Store(path)
    assert len(store) == 1 and {"x": 2} not in store
    store.put({"x": 2}, {"y": 4})
    assert {"x": 2} in Store(path) and Store(path)[{"x": 2}] == {"y": 4}
    assert [row["cell"] for row in lines(path)] == [{"x": 1}, {"x": 2}]
    assert (tmp_path / "s.jsonl.torn").read_text() == '{"cell": {"x": 2}, "res\n'


def test_the_torn_file_keeps_the_last_few_fragments_and_says_their_sizes(tmp_path):
    # Every fragment was kept: sixteen kills mid-record left a 229 MB .torn file.
    path, torn = tmp_path / "s.jsonl", tmp_path / "s.jsonl.torn"
    Store(path).put({"x": 0}, {"y": 0})
    for k in range(1, 7):
        with path.open("a") as f:
            f.write(f'{{"cell": {{"x": {k}}}, "pad": "{"z" * 1000}')
        with pytest.warns(
            RuntimeWarning,
            match=r"1 incomplete .*\(1,0\d\d bytes\).*keeps the last 3, [\d,]+ bytes now",
        ):
            Store(path)
    assert [line[:16] for line in torn.read_text().splitlines()] == [
        f'{{"cell": {{"x": {k}' for k in (4, 5, 6)
    ]
    assert [row["cell"] for row in lines(path)] == [{"x": 0}]


def test_a_torn_path_that_is_a_folder_is_named(tmp_path):
    path = tmp_path / "s.jsonl"
    Store(path).put({"x": 0}, {"y": 0})
    (tmp_path / "s.jsonl.torn").mkdir()
    with path.open("a") as f:
        f.write('{"cell": {"x": 1}, "res')
    with pytest.raises(
        StoreError,
        match=r"s\.jsonl\.torn: cannot set the store's torn lines aside \(it is a "
        r"folder, not a file\): move it away",
    ):
        Store(path)
    assert path.read_text().endswith('"res')  # nothing repaired, nothing lost


CHILD = textwrap.dedent("""
    import os, sys, time
    from helpers.sweep import Store, sweep

    real_write = os.write

    def write_half_then_hang(fd, data):
        # The last cell's record: write half of it, tell the parent, and wait to be killed.
        if b'"x": 3' in bytes(data):
            real_write(fd, bytes(data)[: len(data) // 2])
            print("torn", flush=True)
            time.sleep(120)
        return real_write(fd, data)

    os.write = write_half_then_hang
    sweep(Store(sys.argv[1]), [{"x": x} for x in range(4)], lambda c: {"y": c["x"], "pad": "z" * 200_000})
""")


def test_a_writer_killed_mid_record_costs_only_the_torn_cell(tmp_path):
    path = tmp_path / "s.jsonl"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        said = child.stdout.readline()
        assert said == b"torn\n", child.stderr.read().decode()
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert not path.read_bytes().endswith(b"\n")  # the kill left a fragment

    calls = []
    with pytest.warns(RuntimeWarning, match="1 incomplete"):
        store = Store(path)
    rows = sweep(
        store, [{"x": x} for x in range(4)], lambda c: calls.append(c["x"]) or {"y": c["x"]}
    )
    assert calls == [3]
    assert [r["y"] for r in rows] == [0, 1, 2, 3]
    assert [row["cell"]["x"] for row in lines(path)] == [0, 1, 2, 3]
    fragment = (tmp_path / "s.jsonl.torn").read_bytes()
    assert fragment.startswith(b'{"cell": {"x": 3}') and len(fragment) > 100_000


def test_lines_that_are_not_records_are_moved_aside_once(tmp_path):
    """A store written before torn lines were detected holds a fragment glued to the record
    appended after it; it is set aside (its cell computed again), and the file is left whole."""
    path = tmp_path / "s.jsonl"
    good = [json.dumps({"cell": {"x": x}, "result": {"y": x}}) for x in (1, 3)]
    glued = '{"cell": {"x": 2}, "res' + json.dumps({"cell": {"x": 2}, "result": {"y": 2}})
    path.write_text("\n".join([good[0], glued, good[1], '{"cell": {"x": 4}}']) + "\n")
    with pytest.warns(RuntimeWarning, match="2 incomplete or unreadable"):
        store = Store(path)
    assert sorted(c["x"] for c in (row["cell"] for row in lines(path))) == [1, 3]
    assert {"x": 2} not in store and len(store) == 2
    assert (tmp_path / "s.jsonl.torn").read_text() == glued + '\n{"cell": {"x": 4}}\n'
    store.put({"x": 2}, {"y": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the file is whole now: no second warning
        assert len(Store(path)) == 3


@pytest.mark.filterwarnings("error")
def test_a_last_record_missing_only_its_newline_is_kept(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"cell": {"x": 1}, "result": {"y": 1}}))
    store = Store(path)
    store.put({"x": 2}, {"y": 2})
    assert [row["cell"]["x"] for row in lines(path)] == [1, 2] and not (
        tmp_path / "s.jsonl.torn"
    ).exists()


def test_rows_of_a_fresh_run_equal_those_of_a_resumed_one(tmp_path):
    """Results are kept as they read back from the file: numpy scalars become Python numbers in
    the first run too, and numpy integers in cells key like Python ints."""
    path = tmp_path / "s.jsonl"
    cells = [{"layer": np.int64(l)} for l in range(3)]
    run = lambda c: {"acc": np.float32(1 / 3) * c["layer"], "n": np.int64(10)}
    fresh = sweep(Store(path), cells, run)
    resumed = sweep(
        Store(path), [{"layer": l} for l in range(3)], lambda c: pytest.fail("recomputed")
    )
    assert [{k: r[k] for k in ("acc", "n")} for r in fresh] == [
        {k: r[k] for k in ("acc", "n")} for r in resumed
    ]
    assert type(fresh[1]["acc"]) is float and type(fresh[1]["n"]) is int


def test_sweep_computes_a_repeated_cell_once(tmp_path):
    calls = []
    rows = sweep(
        Store(tmp_path / "s.jsonl"),
        [{"x": 1}, {"x": 2}, {"x": 1}],
        lambda c: calls.append(c["x"]) or {"y": c["x"]},
    )
    assert calls == [1, 2] and [r["y"] for r in rows] == [1, 2, 1]


def test_what_the_store_cannot_keep_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "s.jsonl"
    store = Store(path)
    store.put({"x": 1}, {"y": 1})
    before = path.read_bytes()
    for cell, result, says in [
        ([1], {"y": 1}, "dict of its settings"),
        ({"x": 2}, 0.5, "a result is a dict"),
        ({"x": 2}, {"y": object()}, "JSON values"),
        ({"x": object()}, {"y": 1}, "JSON values"),
    ]:
        with pytest.raises(StoreError, match=says):
            store.put(cell, result)
    assert path.read_bytes() == before
    calls = []
    # every cell checked before the first runs
    with pytest.raises(StoreError, match="dict of its settings"):
        sweep(store, [{"x": 5}, "x=6"], lambda c: calls.append(c) or {})
    assert calls == []


def test_a_write_interrupted_inside_the_process_leaves_no_fragment(tmp_path, monkeypatch):
    path = tmp_path / "s.jsonl"
    store = Store(path)
    store.put({"x": 1}, {"y": 1})
    real_write = os.write

    def half_then_ctrl_c(fd, data):
        real_write(fd, bytes(data)[: len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "write", half_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        store.put({"x": 2}, {"y": 2})
    monkeypatch.undo()
    store.put({"x": 3}, {"y": 3})
    assert [row["cell"]["x"] for row in lines(path)] == [1, 3]


# --- several processes on one store --------------------------------------------------------------

WRITER = textwrap.dedent("""
    import json, os, sys, time, types
    from pathlib import Path

    # The package without its __init__ (which imports torch): both writers start in a fraction of a second.
    sys.modules["helpers"] = types.ModuleType("helpers")
    sys.modules["helpers"].__path__ = [sys.argv[4]]
    from helpers.sweep import Store, sweep

    store_path, folder, me = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    (folder / f"ready-{me}").touch()
    while not (folder / "go").exists():  # both start together
        time.sleep(0.001)
    rows = sweep(Store(store_path), [{"x": x} for x in range(12)],
                 lambda c: time.sleep(0.02) or {"y": c["x"] ** 2, "by": me})
    print(json.dumps(rows))
""")


def two_writers(tmp_path, path):
    """Run WRITER twice at once on `path`; their rows and what they said on stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    package = os.path.dirname(helpers.sweep.__file__)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(tmp_path), me, package],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for me in ("a", "b")
    ]
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready-{me}").exists() for me in ("a", "b")):
            assert time.monotonic() < deadline and all(c.poll() is None for c in children), (
                children[0].stderr.read()
            )
            time.sleep(0.005)
        (tmp_path / "go").touch()
        outs = [c.communicate(timeout=60) for c in children]
    finally:
        for c in children:
            c.kill()
    assert all(c.returncode == 0 for c in children), [err for _, err in outs]
    return [json.loads(out) for out, _ in outs], [err for _, err in outs]


def test_two_processes_started_together_compute_each_cell_once(tmp_path):
    """The issue's repro: two terminals running one chapter both computed everything and
    appended duplicates. Now the second waits, says for whom, and reuses the first one's cells."""
    path = tmp_path / "s.jsonl"
    (rows_a, rows_b), (err_a, err_b) = two_writers(tmp_path, path)
    assert rows_a == rows_b and [r["y"] for r in rows_a] == [x * x for x in range(12)]
    assert len({r["by"] for r in rows_a}) == 1  # one process computed every cell
    records = lines(path)
    assert sorted(r["cell"]["x"] for r in records) == list(range(12))  # nothing twice, nothing lost
    waiter = err_b if rows_a[0]["by"] == "a" else err_a
    assert re.search(rf"{path} is being written by pid \d+ on .* since .*: waiting", waiter), waiter


def test_two_processes_opening_a_torn_store_together_repair_it_once_and_lose_nothing(tmp_path):
    """The race that lost records: one process cut a torn tail while the other appended after it."""
    path = tmp_path / "s.jsonl"
    for x in range(4):
        Store(path).put({"x": x}, {"y": x * x, "by": "before"})
    with path.open("a") as f:
        f.write('{"cell": {"x": 4}, "res')
    (rows_a, rows_b), _ = two_writers(tmp_path, path)
    assert rows_a == rows_b and [r["by"] for r in rows_a[:4]] == ["before"] * 4
    records = lines(path)
    assert sorted(r["cell"]["x"] for r in records) == list(range(12))
    assert (tmp_path / "s.jsonl.torn").read_text() == '{"cell": {"x": 4}, "res\n'  # set aside once


def test_a_store_opened_again_inside_its_own_sweep_does_not_wait_for_itself(tmp_path):
    path = tmp_path / "s.jsonl"
    rows = sweep(Store(path), [{"x": 1}, {"x": 2}], lambda c: {"n": len(Store(path))})
    assert [r["n"] for r in rows] == [0, 1]


def test_a_results_path_that_is_a_file_is_a_store_error_naming_ga_results(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("GA_RESULTS", str(blocker))
    with pytest.raises(
        StoreError,
        match=r"s\.jsonl\.lock: cannot .*not-a-folder is a file, not a folder.*set GA_RESULTS to a writable "
        r"folder \(GA_RESULTS=.*not-a-folder\)",
    ):
        Store(blocker / "s.jsonl")


@pytest.fixture
def tiny_disk(tmp_path):
    """A 256 KiB tmpfs (as root, or through passwordless sudo in CI); skipped where mounting is not
    permitted."""
    disk = tmp_path / "disk"
    disk.mkdir()
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    mounted = subprocess.run(
        [*sudo, "mount", "-t", "tmpfs", "-o", "size=256k,mode=1777", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here to fill a disk: {mounted.stderr.strip()}")
    yield (
        disk,
        lambda options: subprocess.run(
            [*sudo, "mount", "-o", f"remount,{options}", str(disk)], check=True
        ),
    )
    subprocess.run([*sudo, "umount", str(disk)], check=True)


def test_a_full_disk_leaves_a_store_that_the_next_run_resumes(tmp_path, tiny_disk, monkeypatch):
    disk, remount = tiny_disk
    monkeypatch.setenv("GA_RESULTS", str(disk))
    cells = [{"x": x} for x in range(30)]
    run = lambda c: calls.append(c["x"]) or {"y": c["x"], "pad": "z" * 20_000}
    calls = []
    with pytest.raises(
        StoreError, match=r"s\.jsonl: cannot append .*No space left on device.*GA_RESULTS="
    ):
        sweep(Store(disk / "s.jsonl"), cells, run)
    kept = [row["cell"]["x"] for row in lines(disk / "s.jsonl")]  # every line a whole record
    assert 0 < len(kept) < 30 and kept == list(range(len(kept))) and calls == kept + [len(kept)]

    # On a full disk a sidecar that needs no change is not written; one that does keeps its old text.
    from helpers.protocol import stores

    m1, m2 = (type("Loaded", (), {"name": name, "revision": "r"}) for name in ("m1", "m2"))
    stores.open_store("made_up", "cpu", "part", [m1])
    sidecar = next((disk / "made_up").glob("*.models.json"))
    filler = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    with pytest.raises(OSError, match="No space left"):
        while True:  # the last free pages
            os.write(filler, b"0" * 4096)
    os.close(filler)
    stores.open_store("made_up", "cpu", "part", [m1])
    with pytest.raises(
        StoreError, match=r"\.models\.json: cannot write the store's sidecar .*No space left"
    ):
        stores.open_store("made_up", "cpu", "part", [m1, m2])
    assert json.loads(sidecar.read_text()) == {"m1": "r"} and not list(disk.glob("made_up/*.tmp"))
    os.unlink(disk / "filler")

    remount("size=4m")
    calls = []
    rows = sweep(Store(disk / "s.jsonl"), cells, run)
    assert calls == list(range(len(kept), 30))
    fresh = sweep(Store(tmp_path / "fresh.jsonl"), cells, run)
    assert (
        rows == fresh and (disk / "s.jsonl").read_bytes() == (tmp_path / "fresh.jsonl").read_bytes()
    )

    remount("ro")
    with pytest.raises(
        StoreError,
        match=r"other\.jsonl: cannot add a record: this process cannot write its folder.*GA_RESULTS",
    ):
        Store(disk / "other.jsonl").put({"x": 1}, {"y": 1})
    # Complete results on a read-only disk are read as they are (the lock file was opened to write)
    calls = []
    assert sweep(Store(disk / "s.jsonl"), cells, run) == rows and calls == []
    assert stores.open_store("made_up", "cpu", "part", [m1]) is not None
    with pytest.raises(
        StoreError, match=r"s\.jsonl: cannot add a record: this process cannot write its folder"
    ):
        sweep(Store(disk / "s.jsonl"), cells + [{"x": 30}], run)
    assert calls == []  # refused before the missing cell was computed


def test_a_stale_view_never_writes_a_cell_twice(tmp_path):
    # Two views of one store (two processes, or two opens in one): the one that looked first
    # does not append a cell the other wrote since; it reads theirs.
    path = tmp_path / "s.jsonl"
    mine, theirs = Store(path), Store(path)
    theirs.put({"x": 1}, {"by": "theirs"})
    mine.put({"x": 1}, {"by": "mine"})
    assert len(lines(path)) == 1 and mine[{"x": 1}] == {"by": "theirs"}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from helpers.sweep import Store; "
            "Store(sys.argv[1]).put({'x': 2}, {'by': 'other process'})",
            str(path),
        ],
        env=env,
        check=True,
    )
    mine.put({"x": 2}, {"by": "mine"})
    assert [r["result"]["by"] for r in lines(path)] == ["theirs", "other process"]


def test_a_lock_file_deleted_while_held_stops_the_writer_with_the_fix(tmp_path):
    # Deleting it let a second writer take a fresh lock beside the first (28 of 60 cells twice).
    path = tmp_path / "s.jsonl"
    store = Store(path)
    with store.lock():
        (tmp_path / "s.jsonl.lock").unlink()
        with pytest.raises(
            StoreError, match=r"s\.jsonl\.lock.*deleted or replaced.*never delete a \.lock"
        ):
            store.put({"x": 1}, {"y": 1})
    assert not path.exists() or lines(path) == []
    store.put({"x": 1}, {"y": 1})  # a lock taken afresh is the one on disk


def test_a_second_process_is_stopped_when_the_first_ones_lock_file_vanishes(tmp_path):
    path = tmp_path / "s.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import sys, time
        from pathlib import Path
        from helpers.sweep import Store
        store = Store(sys.argv[1])
        with store.lock():
            Path(sys.argv[1] + ".held").touch()
            while not Path(sys.argv[1] + ".go").exists():
                time.sleep(0.01)
            store.put({"x": 1}, {"by": "first"})
        """),
            str(path),
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "s.jsonl.held").exists():
            assert time.monotonic() < deadline and holder.poll() is None, holder.stderr.read()
            time.sleep(0.01)
        (tmp_path / "s.jsonl.lock").unlink()
        Store(path).put({"x": 2}, {"by": "second"})  # takes a fresh lock: it cannot know
        (tmp_path / "s.jsonl.go").touch()
        _, err = holder.communicate(timeout=60)
    finally:
        holder.kill()
    assert holder.returncode != 0 and "deleted or replaced" in err
    assert [r["result"]["by"] for r in lines(path)] == ["second"]


def test_a_store_with_crlf_line_ends_is_read_as_it_is(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(
        b'{"cell": {"x": 1}, "result": {"y": 1}}\r\n{"cell": {"x": 2}, "result": {"y": 2}}\r\n'
    )
    before = path.read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing set aside, nothing rewritten
        store = Store(path)
    assert len(store) == 2 and store[{"x": 2}] == {"y": 2} and path.read_bytes() == before
    assert sweep(store, [{"x": 1}, {"x": 2}], lambda c: 1 / 0) == [
        {"x": 1, "y": 1},
        {"x": 2, "y": 2},
    ]
