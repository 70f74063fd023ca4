import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

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
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
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
    rows = sweep(store, [{"x": x} for x in range(4)], lambda c: calls.append(c["x"]) or {"y": c["x"]})
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
    assert [row["cell"]["x"] for row in lines(path)] == [1, 2] and not (tmp_path / "s.jsonl.torn").exists()


def test_rows_of_a_fresh_run_equal_those_of_a_resumed_one(tmp_path):
    """Results are kept as they read back from the file: numpy scalars become Python numbers in
    the first run too, and numpy integers in cells key like Python ints."""
    path = tmp_path / "s.jsonl"
    cells = [{"layer": np.int64(l)} for l in range(3)]
    run = lambda c: {"acc": np.float32(1 / 3) * c["layer"], "n": np.int64(10)}
    fresh = sweep(Store(path), cells, run)
    resumed = sweep(Store(path), [{"layer": l} for l in range(3)], lambda c: pytest.fail("recomputed"))
    assert [{k: r[k] for k in ("acc", "n")} for r in fresh] == [{k: r[k] for k in ("acc", "n")} for r in resumed]
    assert type(fresh[1]["acc"]) is float and type(fresh[1]["n"]) is int


def test_sweep_computes_a_repeated_cell_once(tmp_path):
    calls = []
    rows = sweep(Store(tmp_path / "s.jsonl"), [{"x": 1}, {"x": 2}, {"x": 1}],
                 lambda c: calls.append(c["x"]) or {"y": c["x"]})
    assert calls == [1, 2] and [r["y"] for r in rows] == [1, 2, 1]


def test_what_the_store_cannot_keep_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "s.jsonl"
    store = Store(path)
    store.put({"x": 1}, {"y": 1})
    before = path.read_bytes()
    for cell, result, says in [([1], {"y": 1}, "dict of its settings"),
                               ({"x": 2}, 0.5, "a result is a dict"),
                               ({"x": 2}, {"y": object()}, "JSON values"),
                               ({"x": object()}, {"y": 1}, "JSON values")]:
        with pytest.raises(StoreError, match=says):
            store.put(cell, result)
    assert path.read_bytes() == before
    calls = []
    with pytest.raises(StoreError, match="dict of its settings"):  # every cell checked before the first runs
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
