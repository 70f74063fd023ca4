import pytest

from helpers.sweep import Store, sweep


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


def test_store_skips_a_line_cut_short(tmp_path):
    path = tmp_path / "s.jsonl"
    Store(path).put({"x": 1}, {"y": 1})
    with path.open("a") as f:
        f.write('{"cell": {"x": 2}, "res')
    store = Store(path)
    assert len(store) == 1 and {"x": 2} not in store
