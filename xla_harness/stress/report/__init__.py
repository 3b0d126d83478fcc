"""Statistics and reports: the results table (summary), its JSON and figure, the intervals and tests
(stats), and the pairwise designs of ``make tpu-pairs`` (pairs)."""
