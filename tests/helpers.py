"""Small shared settings for the tests: a tiny model that compiles in about a second."""

TINY = dict(vocab=64, d_model=32, layers=1, heads=2, seq=8, batch=8)
TINY_ARGS = ["--vocab", "64", "--d-model", "32", "--layers", "1", "--heads", "2", "--seq", "8",
             "--batch", "8"]
