"""A program that raises where it is told: in its factory (``where='make'``) or in ``init``."""

import sys

sys.path.insert(0, __file__.rsplit("/", 3)[0])  # the checkout: the quickstart program beside it

from examples.quickstart.my_model import make as _make  # noqa: E402


def make(where="nowhere"):
    if where == "make":
        raise RuntimeError("planted in make")
    program = _make()
    if where != "init":
        return program

    def init(key):
        raise ValueError("planted in init")

    return program.__class__(**{**program.__dict__, "init": init})
