"""The tokenizing and splitting of HLO text that the rest of the HLO reader shares.

Whitespace, brackets (any kind, nested, quotes respected), quoted strings, comments, an
instruction's ``, key=value`` attributes and commas at the top level of a bracketed list.
Each function takes the text and an index into it and returns an index (or the pieces);
malformed text raises ValueError saying what was expected. Nothing here recurses on the
input's nesting, and nothing here holds state between calls.
"""

from __future__ import annotations

import re

WS = re.compile(r"\s*")


def ws_end(text: str, i: int) -> int:
    """Index of the first non-whitespace character at or after text[i] (len(text) if none)."""
    m = WS.match(text, i)
    assert m is not None  # '\s*' matches (possibly empty) at every index
    return m.end()


_BRACKETS = re.compile(r'[{}()\[\]"]')
OPENERS = {"{": "}", "(": ")", "[": "]"}  # each opening bracket -> the bracket closing it
_CLOSER_OF = {v: k for k, v in OPENERS.items()}


def match_brace(text: str, i: int) -> int:
    """Index just past the bracket closing the one at text[i] (quotes respected, any
    bracket kind nested inside)."""
    stack: list[str] = []  # the closers expected, innermost last
    n = len(text)
    pat = _BRACKETS
    while i < n:
        m = pat.search(text, i)
        if m is None:
            break
        ch = m.group()
        i = m.end()
        if ch == '"':
            i = skip_string(text, i)
        elif ch in OPENERS:
            stack.append(OPENERS[ch])
        else:
            if not stack or stack[-1] != ch:
                expected = f", expected '{stack[-1]}'" if stack else ""
                raise ValueError(f"unbalanced '{ch}'{expected}")
            stack.pop()
            if not stack:
                return i
    if not stack:
        raise ValueError("expected a bracket")
    opener = _CLOSER_OF[stack[-1]]
    raise ValueError(f"unbalanced '{opener}': the text ends before its '{stack[-1]}'")


_STR_END = re.compile(r'\\.|"', re.S)


def skip_string(text: str, i: int) -> int:
    """Index just past the closing quote of a string whose body starts at i."""
    while True:
        m = _STR_END.search(text, i)
        if m is None:
            raise ValueError("unterminated string")
        if m.group() == '"':
            return m.end()
        i = m.end()


_SPECIAL = re.compile(r'[{}()\[\]",]')


def split_top(text: str) -> list[str]:
    """Split at commas not nested in brackets or strings: the pieces, unstripped (one piece,
    the whole text, when there is no such comma)."""
    parts: list[str] = []
    depth = 0
    start = 0
    i = 0
    while True:
        m = _SPECIAL.search(text, i)
        if m is None:
            break
        ch = m.group()
        i = m.end()
        if ch == '"':
            i = skip_string(text, i)
        elif ch in "{([":
            depth += 1
        elif ch in "})]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i - 1])
            start = i
    parts.append(text[start:])
    return parts


_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_LINE_COMMENT = re.compile(r'"(?:[^"\\\n]|\\.)*"|//')
_COMMENT_START = re.compile(r"/[*/]")  # one regex search: faster than two substring tests of the whole text


def strip_comments(text: str) -> str:
    """The text with /* */ comments (strings not looked at) and // comments outside strings
    removed, keeping line numbers (the text itself when it has neither)."""
    if _COMMENT_START.search(text) is None:
        return text
    if "/*" in text:
        text = _BLOCK_COMMENT.sub(lambda m: "\n" * m.group().count("\n") or " ", text)
    if "//" in text:
        lines = text.split("\n")
        for k, line in enumerate(lines):
            if "//" in line:
                for m in _LINE_COMMENT.finditer(line):
                    if m.group() == "//":
                        lines[k] = line[:m.start()]
                        break
        text = "\n".join(lines)
    return text


_NAME = r"[A-Za-z_][\w.\-]*"
_ATTR_KEY = re.compile(rf"\s*({_NAME})\s*=\s*")
_BARE_VALUE = re.compile(r'[^\s,{}()\[\]"]*')


def skip_value(text: str, i: int) -> int:
    """Index just past one attribute value starting at text[i]: a bracketed group, a string,
    or a bare token that may carry bracketed parts (``[2,4]<=[8]T(1,0)``)."""
    start = i
    n = len(text)
    while i < n:
        m = _BARE_VALUE.match(text, i)
        assert m is not None  # the pattern matches the empty string
        i = m.end()
        if i >= n:
            break
        ch = text[i]
        if ch in OPENERS:
            i = match_brace(text, i)
        elif ch == '"':
            i = skip_string(text, i + 1)
        else:
            break
    if i == start:
        raise ValueError(f"expected an attribute value near {text[i:i + 20]!r}")
    return i


def skip_attributes(text: str, i: int) -> int:
    """Index after ', key=value' attributes starting at text[i] (none: i itself)."""
    while True:
        j = ws_end(text, i)
        if not text.startswith(",", j):
            return i
        m = _ATTR_KEY.match(text, j + 1)
        if m is None:
            raise ValueError(f"expected 'name=value' after ',' near {text[j:j + 30]!r}")
        i = skip_value(text, m.end())


def attr_end(text: str, i: int) -> int:
    """End of the attribute list of an instruction whose operands closed at i. Fast path: the
    rest of the line is complete (balanced, not ending in ',', next line not starting with ',')."""
    eol = text.find("\n", i)
    if eol < 0:
        eol = len(text)
    seg = text[i:eol]
    s = seg.strip()
    if not s:
        j = ws_end(text, eol)
        return eol if not text.startswith(",", j) else skip_attributes(text, i)
    if (s[0] == "," and s[-1] not in ",=" and seg.count("{") == seg.count("}") and seg.count("(") == seg.count(")")
            and seg.count("[") == seg.count("]") and (seg.count('"') - seg.count('\\"')) % 2 == 0
            and not text.startswith(",", ws_end(text, eol))):
        return eol
    return skip_attributes(text, i)


def attributes_end_here(rest: str) -> bool:
    """True when the attribute text after a one-line instruction's operands is complete on its line:
    empty, or ', ...' with braces and quotes balanced, not ending in ',' or '=' (XLA prints
    '(' and '[' in attribute values only inside braces or strings, so those balance with them)."""
    s = rest.strip()
    return not s or (s[0] == "," and s[-1] not in ",=" and rest.count("{") == rest.count("}")
                     and (rest.count('"') - (rest.count('\\"') if "\\" in rest else 0)) % 2 == 0)
