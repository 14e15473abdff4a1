"""``grokc bench``'s bytes a decode step must read (``compiler/bench.py``, ``decode_bytes``).

A step reads one row of the RoPE table per attention launch, whatever the table's length: two builds
of the tiny model that differ only in ``max_seq`` (so in the table's length, 64 against 256 rows, which
the test checks) count the same bytes at the same context. The other weights' count is checked in
``test_quantized_embeddings.py``.
"""

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
