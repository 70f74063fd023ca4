"""The Ray runner (`sweep(..., workers=N)`, `helpers.runner`) on a local 2-CPU cluster, with the
toy zoo's Transformer: the same table as one process, bit for bit; a worker killed mid-run costs
nothing but its cell's time; an interrupted run resumes with only the rest. One cluster for the
module (Ray takes seconds to start, each worker seconds to import torch)."""

import json
import os
import sys
import weakref
from pathlib import Path

import pandas as pd
import pytest

from helpers import benchmarks as bm
from helpers import runner
from helpers.errors import ConfigError
from helpers.experiments import (
    kv_retrieval,
)
from helpers.protocol import loading, minimal, shared
from helpers.sweep import Store, sweep

TOY = "toy-transformer"
HEADS = {"G": ["L1H0"], "A": ["L2H1"]}
# sizes up to the toy task's 32 values, so that the scores are not all 1
CELLS = [
    dict(model=TOY, pairs=k, n=12, seed=5, query="repeat", heads=HEADS)
    for k in (4, 12, 20, 24, 28, 32)
]
LOG = "GA_TEST_RUNNER_LOG"  # a folder where the measurement below notes each call (pid, cell)


def logged_size(cell):
    """`kv_retrieval.measure_size`, noting the call first; where the folder holds `kill`, the
    first worker to start its second cell is killed (ray.kill on its own actor), once."""
    log = Path(os.environ[LOG])
    with open(log / "calls.jsonl", "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "cell": cell}) + "\n")
    if (log / "kill").exists():
        mine = [c for c in calls(log) if c["pid"] == os.getpid()]
        if len(mine) == 2 and claim(log / "killed", cell):
            import ray

            ray.kill(ray.get_runtime_context().current_actor)
            os._exit(1)  # not reached: the kill ends this process
    return kv_retrieval.measure_size(cell)


def calls(log):
    path = log / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def claim(path, cell) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, json.dumps({"pid": os.getpid(), "cell": cell}).encode())
    os.close(fd)
    return True


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ray = pytest.importorskip("ray")
    log = tmp_path_factory.mktemp("runner-log")
    os.environ[LOG] = str(log)
    here = str(Path(__file__).parent)  # the workers import this module's measurement
    path = os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {LOG: str(log), "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}},
    )
    yield log
    os.environ.pop(LOG)
    runner.shutdown()
    ray.shutdown()


@pytest.fixture
def log(cluster):
    for f in cluster.iterdir():
        f.unlink()
    return cluster


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The table computed here, in one process, once for the module."""
    return sweep(
        Store(tmp_path_factory.mktemp("one") / "one.jsonl"), CELLS, kv_retrieval.measure_size
    )


def stored_cells(path):
    return [json.loads(line)["cell"] for line in path.read_text().splitlines()]


def test_two_workers_give_the_table_of_one_process_bit_for_bit(
    log, one_process, tmp_path, monkeypatch
):
    rows = sweep(Store(tmp_path / "two.jsonl"), CELLS, logged_size, workers=2)
    assert rows == one_process
    assert {r["model"]["correct"] for r in rows} != {"1" * 12}  # the scores are not trivially equal
    assert len({c["pid"] for c in calls(log)}) == 2  # both workers took cells
    # the head ranking, split into one cell per swept layer, with its screen's float estimates
    monkeypatch.setenv("GA_RESULTS", str(tmp_path / "one"))
    alone = shared.kv_ranking(loading.load(TOY), "cpu", True)
    monkeypatch.setenv("GA_RESULTS", str(tmp_path / "two"))
    spread = shared.kv_ranking(loading.load(TOY), "cpu", True, workers=2)
    pd.testing.assert_frame_equal(spread.table, alone.table, check_exact=True)
    assert spread.clean.to_json() == alone.clean.to_json()
    # two layers of 4 heads
    assert spread.table.estimate.nunique() > 1 and spread.table.acc.notna().sum() >= 8


def test_a_worker_killed_mid_run_is_replaced_and_its_cell_computed_once_in_the_store(
    log, one_process, tmp_path
):
    (log / "kill").touch()
    path = tmp_path / "two.jsonl"
    rows = sweep(Store(path), CELLS, logged_size, workers=2)
    killed = json.loads((log / "killed").read_text())
    after = [c["pid"] for c in calls(log) if c["cell"] == killed["cell"]]
    # redone by a fresh worker
    assert after[0] == killed["pid"] and len(after) == 2 and after[1] != killed["pid"]
    assert rows == one_process
    # each cell once
    assert sorted(map(json.dumps, stored_cells(path))) == sorted(map(json.dumps, CELLS))


def failing_size(cell):
    """`kv_retrieval.measure_size`, except that the largest dictionary raises."""
    if cell["pairs"] == 32:
        raise ValueError("no room for 32 keys")
    return kv_retrieval.measure_size(cell)


def test_a_chapters_measurement_of_benchmark_specs_gives_the_table_of_one_process_on_two_workers(
    cluster, tmp_path
):
    """A measurement whose cell names its items by a benchmark's spec (`benchmarks.from_spec`):
    the workers make the same items again (the pruning walk on the toy's letter MCQ and KV task)."""
    cells = [
        dict(model=TOY, benchmark=b.name, items=b.spec)
        for b in (bm.letter_mcq(TOY, None, "cpu", 12, seed=3), bm.kv(TOY, None, 8, 12, seed=3))
    ]
    alone = sweep(Store(tmp_path / "one.jsonl"), cells, minimal.measure_depths)
    assert sweep(Store(tmp_path / "two.jsonl"), cells, minimal.measure_depths, workers=2) == alone
    assert len({r["1"]["correct"] for r in alone}) == 2  # two benchmarks' own items, not one twice


def test_a_measurement_that_raises_on_a_worker_raises_its_own_error_after_the_cells_in_flight(
    cluster, tmp_path
):
    path = tmp_path / "s.jsonl"
    with pytest.raises(ValueError, match="no room for 32 keys"):
        sweep(Store(path), CELLS, failing_size, workers=2)
    # the last cell raised, queued after all the others: those in flight then were finished and kept
    assert sorted(map(json.dumps, stored_cells(path))) == sorted(map(json.dumps, CELLS[:-1]))


def test_an_interrupted_run_resumes_computing_only_the_rest(
    log, one_process, tmp_path, monkeypatch
):
    path = tmp_path / "two.jsonl"
    store = Store(path)
    put = store.put

    def put_two_then_stop(cell, result):
        if len(store) == 2:
            raise KeyboardInterrupt
        put(cell, result)

    monkeypatch.setattr(store, "put", put_two_then_stop)
    with pytest.raises(KeyboardInterrupt):
        sweep(store, CELLS, logged_size, workers=2)
    kept = stored_cells(path)
    assert len(kept) == 2
    # the interrupted run's workers (let go of: the resumed run starts fresh ones)
    first = {c["pid"] for c in calls(log)}
    rows = sweep(Store(path), CELLS, logged_size, workers=2)
    resumed = [json.dumps(c["cell"]) for c in calls(log) if c["pid"] not in first]
    assert sorted(resumed) == sorted(json.dumps(c) for c in CELLS if c not in kept)
    assert rows == one_process


def test_more_workers_than_the_cluster_has_devices_is_refused_naming_the_most(cluster, tmp_path):
    with pytest.raises(
        ConfigError, match=r"workers=3, but the Ray cluster has 2 CPUs .* at most 2"
    ):
        sweep(Store(tmp_path / "s.jsonl"), CELLS, logged_size, workers=3)
    assert len(Store(tmp_path / "s.jsonl")) == 0


def test_a_closure_sent_to_workers_is_refused_naming_the_fix(tmp_path):
    loaded = object()

    def compute(cell):
        return {"model": str(loaded)}

    with pytest.raises(
        ConfigError,
        match=r"module-level function of a cell .*test_runner\..*compute.*"
        r"loading\.model_for\(cell\['model'\]\)",
    ):
        sweep(Store(tmp_path / "s.jsonl"), CELLS, compute, workers=2)
    with pytest.raises(ConfigError, match="module-level function"):
        sweep(Store(tmp_path / "s.jsonl"), CELLS, lambda c: {}, workers=2)
    assert not (tmp_path / "s.jsonl").exists()
    assert (
        runner.measurement_name(kv_retrieval.measure_size)
        == "helpers.experiments.kv_retrieval:measure_size"
    )
    assert (
        runner.measurement_name("helpers.protocol.shared:measure_layer")
        == "helpers.protocol.shared:measure_layer"
    )


def chapter_measurements() -> list:
    """The chapters' measurements, found rather than listed: every module-level function of
    `helpers.experiments` and `helpers.protocol` whose one parameter is a `cell` (private helpers
    of a cell, `shared._engine`, are not measurements)."""
    import importlib
    import inspect
    import pkgutil

    import helpers.experiments
    import helpers.protocol

    found = []
    for package in (helpers.experiments, helpers.protocol):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            module = importlib.import_module(info.name)
            found += [
                f
                for _, f in inspect.getmembers(module, inspect.isfunction)
                if f.__module__ == module.__name__
                and not f.__name__.startswith("_")
                and list(inspect.signature(f).parameters) == ["cell"]
            ]
    return found


MEASUREMENTS = chapter_measurements()


def test_the_measurements_are_found_in_every_kind_of_chapter_module():
    names = {runner.measurement_name(m) for m in MEASUREMENTS}
    assert {
        "helpers.experiments.kv_retrieval:measure_size",  # a chapter's module
        "helpers.experiments.robustness.patching:measure_patching",  # a chapter's package
        "helpers.protocol.head_screen:measure_conditions",  # the protocol
        "helpers.experiments.toy_zoo:measure_final",  # missing from the list this replaced
    } <= names
    assert len(MEASUREMENTS) >= 24


@pytest.mark.parametrize(
    "measure", MEASUREMENTS, ids=lambda m: f"{m.__module__.rpartition('.')[2]}.{m.__name__}"
)
def test_every_chapters_measurement_can_be_sent_to_a_worker(measure):
    assert runner.measurement_name(measure) == f"{measure.__module__}:{measure.__name__}"
    assert runner.measurement(runner.measurement_name(measure)) is measure


def test_a_benchmark_made_again_from_its_spec_holds_the_same_items_in_order():
    """`benchmarks.from_spec` of a benchmark's spec, read back from JSON as a store holds it,
    gives its items again: for each kind, on a toy and on the CPU profile's letter set, and for
    a part of a seeded split of a part."""
    smol = "smollm2-135m-instruct"  # its items need no model: only a segments function reads the tokenizer
    made = [
        bm.kv(TOY, None, 4, 6, seed=2),
        bm.kv(smol, None, 4, 6, seed=2, query="repeat"),
        bm.letter_mcq(TOY, None, "cpu", 6, seed=1),
        bm.letter_mcq(smol, None, "cpu", 6, seed=1, k_shot=1),
        *bm.knowledge(TOY, "cpu", 5),
        *bm.knowledge(smol, "cpu", 5, seed=4),
    ]
    every = bm.letter_mcq(smol, None, "cpu", 40, seed=1)
    check = bm.part(every, 10, 30, shuffle="split-1")
    made += [
        check,
        bm.part(check, 0, 5),
        bm.part(bm.kv(smol, None, 4, 9), 3),
        bm.twins(check),
        bm.letter_mcq(smol, None, "cpu", 6, seed=1, permuted=True),
    ]
    for b in made:
        again = bm.from_spec(json.loads(json.dumps(b.spec)), None)
        assert (again.name, again.role, again.items) == (
            b.name,
            b.role,
            b.items,
        ) and again.spec == b.spec
    # the seeded split: disjoint consecutive ranges, each in the whole's order; not the whole's first items
    screen = bm.part(every, 0, 10, shuffle="split-1")
    assert not set(screen.items) & set(check.items) and len(set(screen.items + check.items)) == 30
    assert (
        check.items == [it for it in every.items if it in check.items]
        and check.items != every.items[10:30]
    )
    assert bm.part(check, 0, 5).items == check.items[:5]
    # the seed is in the spec
    assert bm.from_spec(bm.kv(TOY, None, 4, 6, seed=3).spec, None).items != made[0].items
    # the twins of the very items
    assert [
        c.pairs[0][0].removeprefix("Question: ").removesuffix("\nAnswer:") in m.pairs[0][0]
        for m, c in zip(check.items, bm.twins(check).items)
    ] == [True] * 20
    with pytest.raises(ConfigError, match="kind is one of kv, mcq, knowledge, twins, part"):
        bm.from_spec({"kind": "mmlu"}, None)


def test_workers_without_ray_installed_name_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[ray\]'"):
        sweep(Store(tmp_path / "s.jsonl"), CELLS, kv_retrieval.measure_size, workers=2)
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[ray\]'"):
        kv_retrieval.Config.for_profile("cpu", smoke=True, model=TOY, workers=2)


@pytest.mark.parametrize("workers", [0, -1, True, 1.5, "2"])
def test_a_bad_worker_count_is_refused_before_any_work(workers):
    with pytest.raises(ConfigError, match="workers must be"):
        kv_retrieval.Config.for_profile("cpu", smoke=True, model=TOY, workers=workers)


def test_a_measurement_run_in_process_gets_the_chapters_model_and_a_worker_loads_each_once(
    monkeypatch,
):
    """A paper model is never loaded twice in one process: `model_for` hands a measurement the
    copy the chapter holds; with none held (a Ray worker), it loads one and keeps it."""
    from helpers import models
    from helpers.registry import Loaded

    loads = []

    def load(name):
        loads.append(name)
        return Loaded(name, object(), None, None)

    monkeypatch.setattr(models, "load", load)
    for cache in ("_held_models", "_kept"):  # the fakes below go with the test
        monkeypatch.setattr(loading, cache, type(getattr(loading, cache))())
    chapters = loading.load("llama-3.2-3b-instruct")
    assert loading.model_for("llama-3.2-3b-instruct") is chapters and loads == [
        "llama-3.2-3b-instruct"
    ]
    del chapters  # the chapter done with it: a worker's own load, kept for its next cells
    kept = loading.model_for("llama-3.2-3b-instruct")
    assert loading.model_for("llama-3.2-3b-instruct") is kept and len(loads) == 2
    first, kept = weakref.ref(kept), None
    loading.model_for("llama-3.1-8b-instruct")  # another model: the worker lets go of the first
    assert first() is None and len(loads) == 3
    # A measurement of two models (a swap) keeps both: its next cell loads nothing, the one before's goes.
    student, teacher = loading.models_for("llamba-3b", "llama-3.2-3b-instruct")
    assert (
        loading.models_for("llamba-3b", "llama-3.2-3b-instruct") == [student, teacher]
        and len(loads) == 5
    )
    assert set(loading._kept) == {"llamba-3b", "llama-3.2-3b-instruct"}


def test_the_ranking_split_into_layer_cells_equals_one_sweep_of_all_its_layers(
    monkeypatch, tmp_path
):
    """`shared.kv_ranking` (a screen cell, then one cell per swept layer) gives the table of
    `screen.rank_heads`, which sweeps the layers in one go on one engine."""
    from helpers import benchmarks as bm
    from helpers.engine import SweepEngine
    from helpers.screen import rank_heads

    monkeypatch.setenv("GA_RESULTS", str(tmp_path))
    loaded = loading.load(TOY)
    ranking = shared.kv_ranking(loaded, "cpu", True)
    s = ranking.settings
    engine = SweepEngine(
        loaded,
        loaded.tokenizer,
        bm.kv(
            loaded.name, loaded.tokenizer, s["pairs"], s["n"], s["seed"], s["query"], s["form"]
        ).items,
    )
    whole = rank_heads(engine, s["top"], alpha=s["alpha"], also=s["paper_layers"], progress=False)
    pd.testing.assert_frame_equal(ranking.table, whole, check_exact=True)
    assert ranking.table.acc.notna().sum() >= 2 and ranking.table.estimate.nunique() > 1


def test_rays_processes_left_by_a_killed_driver_are_found_and_a_running_clusters_are_not():
    # kill -9 of a driver left ray::DashboardAgent and ray::RuntimeEnvAgent running for good
    import subprocess
    import time

    # its parent: no raylet
    orphan = subprocess.Popen(["ray::DashboardAgent", "30"], executable="/bin/sleep")
    raylet = subprocess.Popen(
        ["raylet", "-c", "(exec -a ray::IDLE sleep 30) & wait"], executable="/bin/bash"
    )
    try:
        for _ in range(100):
            names = {c for _, c in runner.leftovers()}
            worker = [
                p
                for p in (int(d.name) for d in Path("/proc").glob("[0-9]*"))
                if runner._command(str(p)).startswith("ray::IDLE")
            ]
            if "ray::DashboardAgent" in names and worker:
                break
            time.sleep(0.02)
        found = runner.leftovers()
        assert (orphan.pid, "ray::DashboardAgent") in found
        assert worker and not any(p in worker for p, _ in found)  # the raylet's own worker
    finally:
        for pid in worker:
            os.kill(pid, 9)
        orphan.kill(), raylet.kill()
