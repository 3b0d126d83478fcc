"""Per-test results and a binary's verdict from the output of a gtest run (make xla-test)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_GTEST_LINE = re.compile(r"^\[\s+(RUN|OK|FAILED|SKIPPED)\s+\] (\S+?\.\S+?)(?: \(\d+ ms\))?$", re.M)


@dataclass(frozen=True)
class TestResult:
    name: str
    status: str  # "passed" | "failed" | "skipped" | "crashed"


def parse_gtest(output: str) -> list[TestResult]:
    """Per-test results from a gtest run's output. A test that started and never finished
    (the binary died in it) is "crashed"; the summary's repeated FAILED lines are ignored."""
    seen: dict[str, str] = {}
    mapping = {"RUN": "crashed", "OK": "passed", "FAILED": "failed", "SKIPPED": "skipped"}
    for status, name in _GTEST_LINE.findall(output):
        if status == "RUN" or seen.get(name) == "crashed":
            seen[name] = mapping[status]
    return [TestResult(n, s) for n, s in seen.items()]


def unit_verdict(results: list[TestResult], returncode: int) -> str:
    if not results:
        return "crashed" if returncode else "no tests"
    if any(r.status == "crashed" for r in results) or (returncode < 0 and not results):
        return "crashed"
    if any(r.status == "failed" for r in results) or returncode != 0:
        return "failed"
    return "passed"
