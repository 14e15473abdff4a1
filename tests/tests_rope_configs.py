"""RoPE configurations the tests run: one of each scaling type grokc supports."""

from grokc.core.config import RopeConfig, RopeType

ROPES = {
    "default": RopeConfig(theta=10000.0),
    "linear": RopeConfig(theta=10000.0, type=RopeType.LINEAR, factor=2.0),
    "llama3": RopeConfig(theta=500000.0, type=RopeType.LLAMA3, factor=8.0, low_freq_factor=1.0,
                         high_freq_factor=4.0, original_max_position_embeddings=64),
    "yarn": RopeConfig(theta=10000.0, type=RopeType.YARN, factor=4.0, original_max_position_embeddings=128),
}
