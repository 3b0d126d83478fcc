"""``stress --compile-only``: each configuration compiled for a target and its record written (run),
compile.jsonl read and repaired (records), what ``--resume`` skips or refuses (resume), the compile
table of a matrix (table)."""
