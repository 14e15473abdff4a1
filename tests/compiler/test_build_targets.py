"""Per-target choices stay per target (compiler/pipeline.py ``target_passes``): in a multi-arch build
every arch's plan is the plan a build for that arch alone makes, launch for launch."""

import json

import pytest
from tiny_llama import tiny_config, tiny_loaded

from grokc.compiler.build import BuildOptions, build_loaded

# hidden 256 / intermediate 128: shapes the sm90 split-K batch-1 MLP kernel takes (rules_mlp.fits)
CFG = tiny_config(hidden_size=256, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=64)
OPTS = dict(quant="int4-rtn", batch=2, buckets=(16,), max_seq=64)


def plans(path):
    manifest = json.loads((path / "manifest.json").read_text())
    return {arch: json.loads((path / info["plan"]).read_text()) for arch, info in manifest["archs"].items()}, manifest


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("targets")
    loaded = tiny_loaded(CFG, seed=1)
    out = {}
    for name, archs in (("multi", ("sm80", "sm90")), ("sm90", ("sm90",)), ("sm80", ("sm80",))):
        build_loaded(loaded, root / name, BuildOptions(archs=archs, **OPTS))
        out[name] = plans(root / name)
    return out


def test_each_arch_of_a_multi_arch_build_plans_as_it_would_alone(builds):
    multi, _ = builds["multi"]
    for arch in ("sm80", "sm90"):
        alone, _ = builds[arch]
        assert multi[arch] == alone[arch], f"{arch}: the multi-arch plan differs from the {arch}-only plan"


def test_the_sm90_plan_keeps_its_fused_mlp_beside_an_sm80_plan_without_one(builds):
    multi, manifest = builds["multi"]
    ops = {arch: [launch["op"] for launch in plan["graphs"]["decode_1"]["launches"]] for arch, plan in multi.items()}
    assert ops["sm90"].count("mlp_decode") == CFG.num_layers and "mlp_decode" not in ops["sm80"]
    assert manifest["archs"]["sm90"]["passes"] == ["fuse_decode_mlp", "memory_plan"]
    assert manifest["archs"]["sm80"]["passes"] == ["memory_plan"]
    assert "fuse_decode_mlp" not in manifest["passes"]
