"""An artifact rewritten by an attacker who also rewrites every hash (tests/tamper.py): the manifest
names only plain files inside the folder, checked before anything is opened; the plan is checked
(artifacts/plan_checks.py) against the manifest, the weights and the kernels file. Each case must
end in one ArtifactError naming the problem, with nothing outside the artifact opened."""

import json
import os
import shutil
from pathlib import Path

import pytest
from tamper import edit_plan, file_accesses, manifest, outside, rehash, write_manifest

from grokc.artifacts.store import open_artifact
from grokc.core.errors import ArtifactError


@pytest.fixture
def art(tiny_artifact, tmp_path):
    copy = tmp_path / "art"
    shutil.copytree(tiny_artifact, copy)
    return copy


def opened(art: Path, verify: bool = True):
    """Open the artifact and every plan as the runner does; return what was touched outside it."""
    with file_accesses() as seen:
        a = open_artifact(art, verify=verify)
        for arch in a.manifest.archs:
            a.plan(arch)
    return outside(seen, art)


def refused(art: Path, *fragments: str, verify: bool = True) -> str:
    with file_accesses() as seen:
        with pytest.raises(ArtifactError) as exc:
            a = open_artifact(art, verify=verify)
            for arch in a.manifest.archs:
                a.plan(arch)
    message = str(exc.value)
    assert "\n" not in message
    for f in fragments:
        assert f in message, message
    assert outside(seen, art) == [], outside(seen, art)
    return message


def test_the_untouched_artifact_opens_and_reads_nothing_outside(art):
    assert opened(art) == []


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/hostname", "sm90/../../x", "./tokenizer.json",
                                  "a//b", "tokenizer.json/", "c:\\x", "sm90/plan.json\x00"])
def test_a_manifest_naming_a_file_outside_is_refused_before_it_is_opened(art, tmp_path, name):
    secret = tmp_path / "secret"
    secret.write_text("outside the artifact")
    rehash(art, lambda b: b["files"].update({name: {"sha256": "0" * 64, "bytes": secret.stat().st_size}}))
    refused(art, "not a plain relative path")
    refused(art, "not a plain relative path", verify=False)


def test_a_tokenizer_file_moved_outside_is_refused(art):
    def move(b):
        b["tokenizer"]["file"] = "../../../etc/passwd"
        b["files"]["../../../etc/passwd"] = b["files"].pop("tokenizer.json")
    rehash(art, move)
    refused(art, "../../../etc/passwd", "not a plain relative path")


def test_whether_an_outside_file_exists_is_not_revealed(art, tmp_path):
    (tmp_path / "exists").write_text("x")
    messages = []
    for name in ("exists", "missing"):
        def point_outside(b, name=name):
            for k in [k for k in b["files"] if k.startswith("..")]:
                del b["files"][k]
            b["files"][f"../{name}"] = {"sha256": "0" * 64, "bytes": 1}
        rehash(art, point_outside)
        messages.append(refused(art).replace(name, "NAME"))
    assert messages[0] == messages[1]


def test_symbolic_links_are_refused(art, tmp_path):
    outside_copy = tmp_path / "elsewhere"
    shutil.copytree(art / "sm90", outside_copy)
    shutil.rmtree(art / "sm90")
    os.symlink(outside_copy, art / "sm90")       # a folder link to files with the right hashes
    refused(art, "symbolic link")
    os.unlink(art / "sm90")
    shutil.copytree(outside_copy, art / "sm90")
    (art / "tokenizer.json").rename(tmp_path / "tok")
    os.symlink(tmp_path / "tok", art / "tokenizer.json")
    refused(art, "tokenizer.json", "symbolic link", verify=False)


def test_a_size_that_disagrees_is_refused_before_hashing(art):
    big = art / "weights.safetensors"
    with open(big, "r+b") as f:
        f.truncate(1 << 40)                      # a 1 TB sparse file where the weights were
    refused(art, "weights.safetensors", "bytes but the manifest lists")


def test_a_sparse_terabyte_listed_with_its_size_is_refused_without_hashing_it(art):
    big = art / "weights.safetensors"
    with open(big, "r+b") as f:
        f.truncate(1 << 40)
    rehash_sizes_only(art)
    refused(art, "weights.safetensors", "not a valid safetensors file")


def rehash_sizes_only(art: Path) -> None:
    body = manifest(art)
    body["files"]["weights.safetensors"]["bytes"] = body["weights"]["bytes"] = (art / "weights.safetensors").stat().st_size
    write_manifest(art, body)


def test_files_the_manifest_does_not_name_are_refused(art):
    rehash(art, lambda b: b["files"].update({"notes.txt": b["files"]["tokenizer.json"]}))
    (art / "notes.txt").write_bytes((art / "tokenizer.json").read_bytes())
    rehash(art)
    refused(art, "notes.txt")


@pytest.mark.parametrize("edit,fragment", [
    (lambda b: b["shapes"].update(batch="2"), "shapes.batch"),
    (lambda b: b["shapes"].update(buckets="abc"), "shapes.buckets"),
    (lambda b: b["model"].update(num_heads=0), "num_heads"),
    (lambda b: b["model"].update(hidden_size=True), "hidden_size"),
    (lambda b: b["model"]["rope"].update(theta=-1.0), "theta"),
    (lambda b: b["archs"].update({"smx": b["archs"]["sm90"]}), "smx"),
    (lambda b: b["quant"].update(group_size=None), "group_size"),
    (lambda b: b["tokenizer"].update(eos_token_ids=[10**9]), "10000000"),
    (lambda b: b["shapes"].update(kv_blocks=1), "KV blocks"),
    (lambda b: b.pop("rope"), "rope"),
    (lambda b: b["quant"].update(quality={"tokens": 8, "genres": {"news": {"kl_mean": "low"}}}), "news ppl_reference"),
    (lambda b: b["quant"].update(quality={"tokens": 8, "ppl_reference": 1.0}), "genres"),
])
def test_manifest_fields_of_the_wrong_type_or_range_are_refused(art, edit, fragment):
    rehash(art, edit)
    refused(art, fragment)


def test_a_hash_that_is_not_a_sha256_is_refused(art):
    body = manifest(art)
    body["files"]["tokenizer.json"]["sha256"] = "../etc"
    write_manifest(art, body)           # not rehash: that would put the real hash back
    refused(art, "tokenizer.json", "SHA-256", "not 64 hex digits")


# -- the plan, with every hash rewritten to match -------------------------------------------------

def _launch(plan: dict, op: str, graph: str = "decode_1") -> dict:
    return next(l for l in plan["graphs"][graph]["launches"] if l["op"] == op)


def _arg(launch: dict, param: str) -> dict:
    return next(a for a in launch["args"] if a["param"] == param)


@pytest.mark.parametrize("edit,fragment", [
    (lambda p: p["buffers"]["io.prompt"].update(offset=-256), "io.prompt"),
    (lambda p: _arg(_launch(p, "linear"), "N").update(value=100000), "reads"),
    (lambda p: _arg(_launch(p, "embedding"), "vocab").update(value=10**6), "token_embd.weight"),
    (lambda p: _arg(_launch(p, "attention_decode"), "n_kv_heads").update(value=3), "n_kv_heads"),
    (lambda p: _launch(p, "linear").update(kernel="no_such_kernel"), "no_such_kernel"),
    (lambda p: _launch(p, "linear").update(grid=[0, 1, 1]), "grid"),
    (lambda p: _launch(p, "linear").update(smem=10**9), "shared memory"),
    (lambda p: _launch(p, "linear").update(attrs={"weight_format": "q9"}), "q9"),
    (lambda p: _launch(p, "linear").update(op="nope"), "nope"),
    (lambda p: _arg(_launch(p, "linear"), "x").update(buffer="io.temperature"), "io.temperature"),
    (lambda p: p["buffers"][_arg(_launch(p, "linear"), "out")["buffer"]].update(offset=p["buffers"]["io.prompt"]["offset"]),
     "io.prompt"),
    (lambda p: p["buffers"]["kv.0.k"].update(shape=[1, 2, 16, 16]), "kv.0.k"),
    (lambda p: p.update(arena_bytes=p["arena_bytes"] * 1000), "larger than its buffers"),
    (lambda p: p["graphs"].pop("prefill_16"), "prefill_16"),
    (lambda p: p["graphs"]["decode_1"].update(logits="io.prompt"), "logits"),
    (lambda p: p.pop("graphs"), "graphs"),
    (lambda p: p["buffers"]["io.prompt"].update(shape="x"), "shape"),
    (lambda p: _arg(_launch(p, "linear"), "eps").update(value="1e-5"), "value"),
])
def test_plan_changes_that_would_make_a_kernel_step_outside_its_memory_are_refused(art, edit, fragment):
    edit_plan(art, edit)
    refused(art, fragment)


def test_a_plan_that_is_not_json_is_refused(art):
    (art / "sm90" / "plan.json").write_bytes(b"\x00\xffnot json" + b"[" * 100000)
    rehash(art)
    refused(art, "sm90/plan.json", "not JSON")


def test_manifest_shapes_that_disagree_with_the_plan_are_refused(art):
    rehash(art, lambda b: b["shapes"].update(batch=4, decode_batches=[1, 2, 4]))
    refused(art, "decode_4")
    rehash(art, lambda b: b["shapes"].update(batch=2, decode_batches=[1, 2], kv_blocks=b["shapes"]["kv_blocks"] * 2))
    refused(art, "k_cache")


def test_weights_the_plan_reads_past_are_refused(art):
    """A weights file whose header shrinks a tensor (and the hashes to match): the plan reads past it."""
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(art / "weights.safetensors"))
    weights["token_embd.weight"] = weights["token_embd.weight"][:10].copy()
    save_file(weights, str(art / "weights.safetensors"))
    rehash(art)
    refused(art, "token_embd.weight")


def test_the_plan_json_is_checked_in_inspect_and_verify_too(art):
    from grokc.cli.inspect import describe
    from grokc.cli.verify import verify_artifact

    edit_plan(art, lambda p: p.pop("graphs"))
    for read in (describe, lambda a: list(verify_artifact(a, None))):
        with pytest.raises(ArtifactError, match="not a grokc plan"):
            read(art)


def test_the_gpu_executor_checks_the_plan_as_the_cpu_executor_does(art):
    """GpuExecutor validates before it touches CUDA, so this runs without a GPU."""
    from grokc.artifacts.plan import Plan
    from grokc.runner.gpu import GpuExecutor

    a = open_artifact(art)
    body = json.loads((art / "sm90" / "plan.json").read_text())
    weights, cubin = a.weights(), a.kernels("sm90")
    for edit, fragment in [
        (lambda p: _arg(_launch(p, "linear"), "N").update(value=100000), "reads"),
        (lambda p: _arg(_launch(p, "embedding"), "vocab").update(value=10**6), "token_embd.weight"),
        (lambda p: p["buffers"]["io.prompt"].update(offset=-256), "io.prompt"),
        (lambda p: _launch(p, "linear").update(kernel="absent_kernel"), "absent_kernel"),
        (lambda p: p["buffers"][_arg(_launch(p, "linear"), "out")["buffer"]].update(
            offset=p["buffers"]["io.prompt"]["offset"]), "io.prompt"),
    ]:
        bad = json.loads(json.dumps(body))
        edit(bad)
        with pytest.raises(ArtifactError, match=fragment):
            GpuExecutor(Plan.from_json(bad), weights, cubin)


def test_an_arena_larger_than_the_hosts_memory_is_one_line(art):
    """The CPU executor checks MemAvailable before it allocates and names both sizes."""
    import dataclasses

    from grokc.core.errors import TargetError
    from grokc.runner.cpu import CpuExecutor

    a = open_artifact(art)
    plan = dataclasses.replace(a.plan("sm90"), arena_bytes=1 << 50)   # 1 PiB
    with pytest.raises(TargetError, match=r"needs 1048576\.00 GiB of host memory but this machine has [0-9.]+ GiB"):
        CpuExecutor(plan, a.weights())
