"""``grokc bench``'s bytes a decode step must read (``compiler/bench.py``, ``decode_bytes``).

A step reads one row of the RoPE table per attention launch, whatever the table's length: two builds
of the tiny model that differ only in ``max_seq`` (so in the table's length, 64 against 256 rows, which
the test checks) count the same bytes at the same context. Of stacked experts a step counts those its
rows can select. The other weights' count is checked in ``test_quantized_embeddings.py``.
"""

from tiny_moe import moe_config, moe_loaded

from grokc.artifacts.store import open_artifact
from grokc.cli.bench import decode_bytes
from grokc.compiler.build import BuildOptions, build_loaded


def test_one_rope_row_per_attention_launch(tiny_model, tmp_path):
    counted = {}
    for max_seq in (64, 256):
        build_loaded(tiny_model, tmp_path / str(max_seq), BuildOptions(quant="fp16", batch=2, buckets=(16,),
                                                                        max_seq=max_seq))
        a = open_artifact(tmp_path / str(max_seq))
        plan = a.plan("sm90")
        sizes = {n: w.nbytes for n, w in a.weights().items()}
        table = next(l.arg("rope_table").weight for l in plan.graphs["decode_1"].launches if l.op == "attention_decode")
        assert sizes[table] == max_seq * 8 * 2 * 4   # [table_len, head_dim / 2, (cos, sin)] f32
        counted[max_seq] = decode_bytes(plan, sizes, a.manifest.model, 1, 40)
    assert counted[64] == counted[256]


def test_moe_steps_count_the_selected_experts(tmp_path):
    """A Mixtral of 4 experts, top 2, batch 3: a one-row step reads 2 of each layer's 4 experts, a
    three-row step all 4 (6 choices over 4 experts), plus 2 more embedding rows and 2 more slots of
    KV cache: the difference, from the config and the stored expert sizes alone."""
    cfg = moe_config("mixtral", tie_word_embeddings=False)
    build_loaded(moe_loaded(cfg, seed=1), tmp_path / "a", BuildOptions(quant="fp16", batch=3, buckets=(16,),
                                                                        max_seq=64))
    a = open_artifact(tmp_path / "a")
    plan = a.plan("sm90")
    sizes = {n: w.nbytes for n, w in a.weights().items()}
    experts = sum(s for n, s in sizes.items() if "_exps." in n)
    assert experts == cfg.num_layers * 4 * 3 * cfg.moe.expert_size * cfg.hidden_size * 2   # gate, up, down in f16
    context = 40
    one, three = (decode_bytes(plan, sizes, a.manifest.model, b, context) for b in (1, 3))
    kv_slot = cfg.num_layers * 2 * context * cfg.kv_dim * 2
    assert three - one == experts // 2 + 2 * cfg.hidden_size * 2 + 2 * kv_slot
