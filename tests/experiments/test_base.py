"""What every chapter's Config and results store do, on a chapter made up for the test."""

import json
from dataclasses import dataclass

import numpy as np
import pytest

from helpers import Head, provenance
from helpers.errors import ConfigError, StaleResults, StoreError
from helpers.experiments import toy_zoo
from helpers.protocol import base, fields, stores
from helpers.sweep import sweep


@dataclass(frozen=True)
class Config(base.Config):
    model: str = fields.model("attention")
    n: int | None = fields.count(optional=True)
    sizes: tuple = fields.counts()
    gather: Head = fields.head()
    query: str = fields.one_of("paper", "repeat")
    alpha: float = fields.number(0, 1)

    chapter = "made_up"
    smoke_sizes = dict(n=4, sizes=[2])

    @classmethod
    def defaults(cls, profile):
        return dict(
            model="smollm2-135m-instruct",
            n=100,
            sizes=[2, 8],
            gather="L16H22",
            query="paper",
            alpha=0.5,
        )


def test_a_config_takes_the_profile_then_smoke_then_what_was_set():
    assert Config.for_profile("cpu").n == 100
    smoke = Config.for_profile("cpu", True, sizes=[3, 5])
    assert (smoke.n, smoke.sizes) == (4, (3, 5))  # smoke shrinks only what was not set
    # None: the default; numpy integers count
    cfg = Config.for_profile("paper", n=None, gather=[16, np.int64(2)])
    assert cfg.n == 100 and cfg.gather == Head(16, 2)
    assert cfg.parameters()["gather"] == "L16H2" and cfg.parameters()["sizes"] == [2, 8]


def test_at_smoke_size_a_default_model_runs_its_stand_in_and_a_named_model_runs_as_named(
    monkeypatch,
):
    from helpers import models, registry
    from helpers.experiments import layer_pruning, masking

    letters = registry.cast("cpu", "letters")
    standin = registry.SMOKE_STANDINS["cpu"][letters]
    same = {models.packaged_config(m).model_type for m in (letters, standin)}
    assert len(same) == 1  # one architecture: the same adapter and code paths
    assert layer_pruning.Config.for_profile("cpu").model == letters
    assert layer_pruning.Config.for_profile("cpu", True).model == standin
    assert layer_pruning.Config.for_profile("cpu", True, model=letters).model == letters
    assert masking.Config.for_profile("cpu", True).models == (standin,)  # in lists too
    monkeypatch.setitem(registry.SMOKE_STANDINS, "cpu", {"smollm2-135m-instruct": "gemma-3-270m"})
    assert Config.for_profile("cpu", True).model == "gemma-3-270m"
    assert Config.for_profile("cpu", False).model == "smollm2-135m-instruct"
    assert Config.for_profile("paper", True).model == "smollm2-135m-instruct"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(profile="gpu"), "unknown profile 'gpu': use one of cpu, paper, paper-3b"),
        (dict(n=-5), "n must be at least 1, got -5"),
        (dict(n=2.5), "n must be an integer"),
        (dict(n=True), "n must be an integer, not True"),
        (dict(sizes=[2, 2]), "sizes lists a value twice"),
        (dict(sizes=[]), "sizes must list at least one value"),
        (dict(model="llamba-8b"), "model must be a model \\(attention\\) of the book"),
        (dict(gather="head 3"), "gather: cannot read 'head 3' as a head"),
        (dict(query="ask"), "query must be one of 'paper', 'repeat'"),
        (dict(alpha=2), r"alpha must be a number in \[0, 1\]"),
        (
            dict(heads=3),
            "made_up has no parameter heads; its parameters: model, n, sizes, gather, query, alpha",
        ),
    ],
)
def test_bad_parameters_fail_at_once_with_what_is_valid(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Config.for_profile(**{"profile": "cpu", **kwargs})


def test_store_file_carries_the_version_of_what_computes_it_and_refuses_other_weights(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("GA_RESULTS", str(tmp_path))
    monkeypatch.setattr(stores, "_opened", {})  # the stores this process opened: only this test's
    cfg = Config.for_profile("cpu")
    model = type("Loaded", (), {"name": "smollm2-135m-instruct", "revision": "gguf aaa"})
    store = stores.open_store(cfg.chapter, cfg.profile, "part", [model])
    # opened from outside the package (this test could call anything in it): the whole code version
    assert store.path == tmp_path / "made_up" / f"part-cpu-{provenance.code_version()}.jsonl"
    chapter = stores.open_store(cfg.chapter, cfg.profile, "part", [model], toy_zoo.measure_final)
    assert (
        chapter.path.name
        == f"part-cpu-{provenance.measurement_version('toy_zoo', reads=('measure_final',))}.jsonl"
        != store.path.name
    )
    # filled by its measurement alone: another function is refused before it runs
    with pytest.raises(
        StoreError,
        match=r"versioned by the code of helpers\.experiments\.toy_zoo:measure_final, not .*:run.*name it in open_store's reads",
    ):
        sweep(chapter, [{"x": 1}], toy_zoo.run)
    assert sweep(store, [{"x": 0}], lambda cell: {"y": 2}) == [{"x": 0, "y": 2}]
    # the page links them
    assert base.record(cfg, [], base.Timer())["stores"] == [
        store.path.name,
        chapter.path.name,
    ]
    store.put({"x": 1}, {"y": 2})
    assert {"x": 1} in stores.open_store(cfg.chapter, cfg.profile, "part", [model])
    model.revision = "gguf bbb"
    with pytest.raises(StaleResults, match="other weights.*gguf aaa -> now gguf bbb.*delete"):
        stores.open_store(cfg.chapter, cfg.profile, "part", [model])


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "not JSON"),
        ('{"smollm2-135m-instruct": "gg', "not JSON"),
        ('["gguf aaa"]', "not a mapping of model names to revisions \\(list\\)"),
    ],
)
def test_an_unreadable_sidecar_names_its_file_and_the_fix(tmp_path, monkeypatch, text, says):
    """After a full disk it was left empty, and every rerun failed with a bare JSONDecodeError."""
    monkeypatch.setenv("GA_RESULTS", str(tmp_path))
    model = type("Loaded", (), {"name": "smollm2-135m-instruct", "revision": "gguf aaa"})
    stores.open_store("made_up", "cpu", "part", [model]).put({"x": 1}, {"y": 2})
    sidecar = next(tmp_path.glob("made_up/*.models.json"))
    sidecar.write_text(text)
    with pytest.raises(
        StoreError,
        match=rf"{sidecar}, the record of which weights computed .*\.jsonl, is {says}.*"
        r"delete both files .*or set GA_RESULTS",
    ):
        stores.open_store("made_up", "cpu", "part", [model])


def test_a_store_without_its_sidecar_is_not_trusted_and_an_unchanged_sidecar_is_not_rewritten(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("GA_RESULTS", str(tmp_path))
    model = type("Loaded", (), {"name": "smollm2-135m-instruct", "revision": "gguf aaa"})
    stores.open_store("made_up", "cpu", "part", [model])
    sidecar = next(tmp_path.glob("made_up/*.models.json"))
    before = sidecar.stat()
    stores.open_store("made_up", "cpu", "part", [model]).put({"x": 1}, {"y": 2})
    assert (sidecar.stat().st_ino, sidecar.stat().st_mtime_ns) == (
        before.st_ino,
        before.st_mtime_ns,
    )
    sidecar.unlink()
    with pytest.raises(
        StaleResults,
        match=r"\.jsonl holds results but its sidecar .*models\.json is missing.*"
        r"delete .* or set GA_RESULTS",
    ):
        stores.open_store("made_up", "cpu", "part", [model])


def test_a_sidecar_write_killed_before_its_rename_leaves_no_file_for_good(tmp_path, monkeypatch):
    monkeypatch.setenv("GA_RESULTS", str(tmp_path))
    model = type("Loaded", (), {"name": "smollm2-135m-instruct", "revision": "gguf aaa"})
    stores.open_store("made_up", "cpu", "part", [model])
    sidecar = next(tmp_path.glob("made_up/*.models.json"))
    stale = sidecar.with_name(sidecar.name + ".4242.tmp")
    stale.write_text('{"smollm2-135m-instruct": "gguf a')  # what a kill mid-write leaves
    # another store's: not this open's business
    other = sidecar.with_name("other.models.json.4242.tmp")
    other.write_text("{")
    stores.open_store("made_up", "cpu", "part", [model])
    assert (
        not stale.exists()
        and other.exists()
        and json.loads(sidecar.read_text()) == {"smollm2-135m-instruct": "gguf aaa"}
    )


@pytest.mark.parametrize("sidecar", ["{}", '{"toy-transformer": "zoo 123"}'])
def test_a_sidecar_that_does_not_name_the_stores_model_is_not_trusted_nor_rewritten(
    tmp_path, monkeypatch, sidecar
):
    # It was accepted, and rewritten with this run's revisions: results of unknown weights certified.
    monkeypatch.setenv("GA_RESULTS", str(tmp_path))
    model = type("Loaded", (), {"name": "smollm2-135m-instruct", "revision": "gguf aaa"})
    stores.open_store("made_up", "cpu", "part", [model]).put(
        {"model": model.name, "x": 1}, {"y": 2}
    )
    meta = next(tmp_path.glob("made_up/*.models.json"))
    meta.write_text(sidecar)
    with pytest.raises(
        StaleResults,
        match=r"holds results of smollm2-135m-instruct but its sidecar .* does not say "
        r"which weights.*delete",
    ):
        stores.open_store("made_up", "cpu", "part", [model])
    assert meta.read_text() == sidecar
    other = type("Loaded", (), {"name": "toy-transformer", "revision": "zoo 123"})
    # a model whose results it does not hold: no claim made
    stores.open_store("made_up", "cpu", "part", [other])


@pytest.mark.parametrize(
    "text, listed", [("L1H0", r"\[L1H0\]"), ("[2, 4]", r"\[2, 4\]"), (" [2] ", r"\[2\]")]
)
def test_a_list_given_as_text_says_how_to_pass_a_list_through_papermill(text, listed):
    # papermill's -p passes "[2, 4]" as text: the hint keeps its brackets, not [[2, 4]]
    with pytest.raises(
        ConfigError,
        match=r"sizes must be a list, got .* \(with papermill, pass a list as YAML: "
        rf"-y 'sizes: {listed}'\)$",
    ):
        Config.for_profile("cpu", sizes=text)
