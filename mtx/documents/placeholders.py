"""Placeholders: pieces of a text that must come out exactly as they went in, as many times
(`{name}`, `{{ name }}`, `%s`, `%1$s`, `$VAR`, `${VAR}`, `<x id="1"/>`). They are taken out of
the sentence the model reads and put back at the place the word alignment gives
(project.py), so the model can neither translate nor break them.

`decode.placeholders` lists which: a built-in kind by name (`KINDS`), or `re:` and a regular
expression of one's own. An empty list keeps none.
"""

from __future__ import annotations

import re

from mtx.errors import MtxError

KINDS = {
    # {{ name }}: Jinja, Mustache, Angular
    "double_braces": r"\{\{[^{}]*\}\}",
    # {name}, {0}, {count:>3}, {}: Python, .NET, ICU's simple arguments
    "braces": r"\{[A-Za-z0-9_.:!<>^+\-#$]*\}",
    # %s, %d, %1$s, %.2f, %-5d, %@, %%: printf and its kin (no space flag: "50 % done" is text)
    "printf": r"%(?:\d+\$)?[-+0#']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|z|j|t)?"
    r"[diouxXeEfFgGaAcspn@%]",
    # $VAR, ${VAR}: shells, Perl, PHP
    "dollar": r"\$\{[A-Za-z_][A-Za-z0-9_]*\}|\$[A-Za-z_][A-Za-z0-9_]*",
    # <x id="1"/>, <ph .../>, <bx/>, <ex/>: XLIFF's inline codes written in plain text
    "xliff": r"<(?:x|ph|bx|ex|it|g)\b[^<>]*/>",
}


def compile_patterns(patterns: list[str], where: str = "decode.placeholders") -> re.Pattern | None:
    """One regular expression finding any of `patterns` (None for none), or MtxError naming
    `where` and the bad pattern."""
    parts = []
    for p in patterns:
        if p.startswith("re:"):
            try:
                re.compile(p[3:])
            except re.error as e:
                raise MtxError(f"{where}: {p!r} is not a regular expression ({e})") from None
            if re.compile(p[3:]).match(""):
                raise MtxError(f"{where}: {p!r} matches the empty string")
            parts.append(p[3:])
        elif p in KINDS:
            parts.append(KINDS[p])
        else:
            raise MtxError(f"{where}: {p!r} is neither one of {', '.join(KINDS)} nor re:REGEX")
    return re.compile("|".join(f"(?:{p})" for p in parts)) if parts else None
