"""Stored text as a terminal or a log shows it: on one line, and only what it says.

A schedule's name, an error, a pause's reason or a scope key is text that whoever may
edit a schedule, or a job's exception, chose. Written raw, a carriage return or an escape
sequence rewrites what a terminal shows, and a newline forges a log line. Everything we
write to a terminal or a log of such text goes through :func:`escaped`.
"""


def escaped(text: str) -> str:
    """``text`` with each backslash and each character Python does not print (controls,
    escape sequences, line separators, bidirectional overrides...) written as in a Python
    string literal: a newline reads ``\\n``, ESC ``\\x1b``. Two texts never read the same."""
    if text.isprintable() and "\\" not in text:
        return text  # the usual case, without a pass per character
    return "".join(_escaped(character) for character in text)


def _escaped(character: str) -> str:
    if character.isprintable() and character != "\\":
        return character
    return repr(character)[1:-1]  # '\\' for a backslash, '\\x1b', '\\u202e'...
