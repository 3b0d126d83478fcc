"""The losses of whose.py, in a module of their own (a program spread over files): each planted
cause sits on a line marked ``# plant: KIND``, the line the origin must name."""

from __future__ import annotations

import jax.numpy as jnp


def regression(params, b):
    return jnp.mean((b["x"] @ params["w"] + params["b"]) ** 2)


def mean_of_selected(params, b):
    h = b["x"] @ params["w"] + params["b"]
    picked = jnp.sum(b["keep"][:, None] * h ** 2)
    return picked / jnp.sum(b["keep"]) * 3.0  # plant: zero-over-zero


def log_likelihood(params, b):
    p = jnp.abs(b["x"] @ params["w"] + params["b"]) * b["keep"][:, None]
    return -jnp.mean(jnp.log(p))  # plant: log-zero


def masked_root(params, b):
    h = (b["x"] @ params["w"]) ** 2 * b["keep"][:, None]
    root = jnp.sqrt(h)  # plant: where-trap-branch
    return jnp.mean(jnp.where(h > 0, root, 0.0))  # plant: where-trap


def log_sum_exp(params, b):
    h = b["x"] @ params["w"] + params["b"]
    return jnp.log(jnp.sum(jnp.exp(h + b["shift"])))  # plant: overflow



def flagged(params, b):
    """A NaN the loss adds where the batch flags the step: the loss is non-finite, the gradients (of a
    constant) and so the new state are not: nothing is rolled back."""
    return regression(params, b) + jnp.where(b["keep"][0] == 0, jnp.nan, 0.0)  # plant: loss-nan-constant
