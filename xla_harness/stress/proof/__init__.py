"""A configuration ready to run: the user's step proven to be a plain loop's and compiled once
(same_program), what identifies a compiled step (fingerprint), and the prepared, frozen configuration
with its counters (harness)."""
