"""Subscription patterns: regular expressions over topic names, compiled with RE2. Pure.

One definition for every place a pattern is checked or matched -- the coordinator's consumer
groups, the SDK's ``Consumer.subscribe(pattern=...)``, the Spark source's ``subscribePattern``
-- so a pattern means the same everywhere.

**Dialect.** RE2 syntax (https://github.com/google/re2/wiki/Syntax), matched against the *whole*
topic name, as Kafka's Java client does (``Pattern.matcher(topic).matches()``): ``orders`` selects
the topic ``orders`` only, ``orders.*`` every topic starting with ``orders``. RE2 is the common
part of Java's, Python's and Go's regular expressions; what it leaves out are the constructs that
need backtracking -- backreferences, lookahead and lookbehind, possessive quantifiers and atomic
groups. Those are refused (a pattern that does not compile is INVALID_REQUEST), never run. So are
the two constructs that compile in both dialects but mean different things: a ``[`` inside a
character class (Java: a nested class, ``[a-c[x-z]]``; RE2: a literal ``[``, or a POSIX class like
``[[:alpha:]]``, which Java reads as a nested class) and ``&&`` inside one (Java: intersection,
``[a-z&&[^e]]``; RE2: a literal ``&``). Topic names never contain ``[`` or ``&``, so neither
reading is needed to select topics.

**Why RE2.** A backtracking engine (Python's ``re``, Java's ``Pattern``) takes time exponential
in the topic name for patterns like ``(a+)+``: one such pattern against the topic ``"a"*29 + "-"``
took 22 s per evaluation. RE2 matches in time linear in the name, whatever the pattern.

**Bounds.** Compiling is where RE2's cost hides: a chain of counted repetitions
(``[a-z]{1,1000}`` repeated) compiles to a program whose build time grows with the square of its
size -- 21 s for 1,000 characters of them with RE2's default 8 MiB budget. So a pattern is at most
:data:`MAX_PATTERN_LENGTH` characters, and its compiled program must fit :data:`PROGRAM_BUDGET_BYTES`
(measured: the slowest pattern that fits compiles in ~0.2 s, ordinary ones in well under 1 ms;
a pattern over the budget is refused in ~10 ms). Compiling and matching release the GIL, so
callers on an event loop run them in a thread (``asyncio.to_thread``).

Compiled patterns are cached (:data:`CACHE_SIZE` most recent), so matching the same pattern
again costs only the match.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

from services.errors import InvalidRequestError

#: Longest pattern accepted, in characters (a topic name is at most 249).
MAX_PATTERN_LENGTH = 1_000
#: RE2's ``max_mem`` per compiled pattern: bounds the program size, and with it the compile time.
PROGRAM_BUDGET_BYTES = 256 * 1024
#: Compiled patterns kept (each uses at most PROGRAM_BUDGET_BYTES).
CACHE_SIZE = 256


class TopicPattern:
    """A compiled subscription pattern; :meth:`matches` is a full match of the topic name.

    Thread-safe: RE2 programs are immutable once compiled.
    """

    __slots__ = ("_regexp", "text")

    def __init__(self, text: str, regexp: Any) -> None:
        self.text = text
        self._regexp = regexp

    def matches(self, topic: str) -> bool:
        """Whether the whole of ``topic`` matches (Java's ``Matcher.matches()``)."""
        return self._regexp.fullmatch(topic.encode()) is not None

    def select(self, topics: Iterable[str]) -> frozenset[str]:
        """The topics among ``topics`` that match. Linear in their total length (~1 µs a topic)."""
        fullmatch = self._regexp.fullmatch
        # RE2 matches UTF-8: handing it bytes skips the binding's str-offset bookkeeping (~40%).
        return frozenset(topic for topic in topics if fullmatch(topic.encode()) is not None)

    def __repr__(self) -> str:
        return f"TopicPattern({self.text!r})"


def compile_topic_pattern(text: str) -> TopicPattern:
    """The compiled pattern, or INVALID_REQUEST saying why ``text`` is not one.

    Refused: an empty pattern, one longer than :data:`MAX_PATTERN_LENGTH` characters, one RE2
    cannot parse (including backtracking-only constructs), one whose program exceeds the budget.
    """
    if not isinstance(text, str) or not text:
        raise InvalidRequestError("a subscription pattern must be a non-empty regular expression")
    if len(text) > MAX_PATTERN_LENGTH:
        raise InvalidRequestError(
            f"subscription pattern is {len(text)} characters long; at most {MAX_PATTERN_LENGTH} are accepted "
            f"(pattern starts {text[:40]!r})"
        )
    _ensure_same_in_java(text)
    return _compile(text)


def _ensure_same_in_java(text: str) -> None:
    """Refuse a ``[`` or ``&&`` inside a character class: Java and RE2 read them differently."""
    in_class, i = False, 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            if text.startswith("Q", i + 1):  # \Q...\E quotes everything up to \E
                end = text.find("\\E", i + 2)
                i = len(text) if end < 0 else end + 2
            else:
                i += 2
            continue
        if not in_class and char == "[":
            in_class = True
            i += 1
            i += text.startswith("^", i)
            i += text.startswith("]", i)  # a ']' first in a class is literal in both
            continue
        if in_class and char == "]":
            in_class = False
        elif in_class and (char == "[" or text.startswith("&&", i)):
            found = "&&" if char == "&" else char
            raise InvalidRequestError(
                f"subscription pattern {text!r} has {found!r} inside a character class, which Java reads "
                "as a nested class or an intersection and RE2 as a literal; topic names never contain "
                "'[' or '&': write the class out (e.g. [a-df-z] for [a-z&&[^e]])"
            )
        i += 1


@functools.lru_cache(maxsize=CACHE_SIZE)
def _compile(text: str) -> TopicPattern:
    try:
        return TopicPattern(text, re2.compile(text, _OPTIONS))
    except re2.error as exc:
        raise InvalidRequestError(f"invalid subscription pattern {text!r}: {_reason(exc)}") from None


def _options() -> Any:
    options = re2.Options()
    options.max_mem = PROGRAM_BUDGET_BYTES
    options.never_capture = True  # groups are never read: the DFA alone decides a match
    options.log_errors = False  # a bad pattern is the caller's error, not a line on stderr
    return options


_OPTIONS = _options()


def _reason(exc: Exception) -> str:
    """RE2's message as text, with the budget explained (RE2 says only "pattern too large")."""
    detail = exc.args[0] if exc.args else ""
    message = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
    if "pattern too large" in message:
        return (
            f"it compiles to more than the {PROGRAM_BUDGET_BYTES // 1024} KiB a pattern may use "
            "(large counted repetitions such as x{1,1000}); use fewer or smaller repetition counts "
            "(topic names are at most 249 characters)"
        )
    return f"{message} (RE2 syntax: no backreferences, lookaround, possessive quantifiers or atomic groups)"
