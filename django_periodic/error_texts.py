"""What of an exception we store or log: its message, without the row values a database
adds to it.

PostgreSQL follows its message with fields that quote the row or the key at fault
(``DETAIL:  Failing row contains (...)``, a job's arguments included), the statement
(``LINE 1: ...``), the data (``CONTEXT:``). A schedule's ``last_error`` and a run's
``error_message`` are shown to whoever may view them, and logs go further still: both get
:func:`error_text`. A logged exception's traceback is made the same way by
:class:`WithoutRowValues`, the filter of the ``django_periodic`` logger.
"""

import logging
import re
import traceback
from collections.abc import Iterator

from django_periodic.escaping import escaped

LOGGER_NAME = "django_periodic"

# Where a database's message ends and its fields begin, on a line of their own (psycopg 2
# and 3, as PostgreSQL's psql prints them). Only the message before them is kept: a field's
# value may span lines (a text column holding a newline), so they are cut as a whole.
_FIELDS = re.compile(r"\n(?:DETAIL|HINT|CONTEXT|LINE \d+|QUERY|WHERE|STATEMENT|LOCATION):")


def error_text(exc: BaseException) -> str:
    """``str(exc)`` without the database's fields after its message (they quote row
    values). Use it for every error text that is stored or logged."""
    return _FIELDS.split(_str(exc), maxsplit=1)[0]


def shown(exc: BaseException) -> str:
    """``exc`` as a log line or a terminal shows it: :func:`error_text`, escaped
    (``escaping.py``)."""
    return escaped(error_text(exc))


def traceback_text(exc: BaseException) -> str | None:
    """``exc``'s traceback as ``traceback.format_exception`` writes it, but each exception of
    its chain told by :func:`error_text`; None when that changes nothing (no database fields
    in it)."""
    cut = [(text, error_text(each)) for each in _chain(exc) if (text := _str(each))]
    cut = [(text, kept) for text, kept in cut if kept != text]
    if not cut:
        return None
    text = "".join(traceback.format_exception(exc))
    for full, kept in cut:
        text = text.replace(full, kept)
    return text


class WithoutRowValues(logging.Filter):
    """Log records without a database's row values, and with exceptions escaped.

    An exception logged with its traceback (``logger.exception``) whose chain carries
    database fields gets its traceback as text without them (``record.exc_text``, which
    every ``logging.Formatter`` prints) and no ``exc_info``: a handler or formatter that
    formats the exception again (a JSON formatter, an error tracker) finds none to format.
    An exception passed as an argument of the message is replaced by :func:`shown`.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_shown_if_exception(arg) for arg in record.args)
        if record.exc_info and record.exc_info[1] is not None:
            text = traceback_text(record.exc_info[1])
            if text is not None:  # without its last newline, as formatException leaves it
                record.exc_info, record.exc_text = None, text.removesuffix("\n")
        return True


def install() -> None:
    """Put :class:`WithoutRowValues` on the package's logger (once: ``addFilter`` keeps one
    instance of a filter). A logger's filters see only the records logged on it, so the
    package logs on this one logger, and its run log (``django_periodic.runs``) carries no
    exceptions."""
    logging.getLogger(LOGGER_NAME).addFilter(_FILTER)


_FILTER = WithoutRowValues()


def _shown_if_exception(value: object) -> object:
    return shown(value) if isinstance(value, BaseException) else value


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and the members of exception groups; each once."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        each = pending.pop()
        if id(each) in seen:
            continue
        seen.add(id(each))
        yield each
        linked = [each.__cause__, each.__context__, *getattr(each, "exceptions", ())]
        pending += [link for link in linked if isinstance(link, BaseException)]


def _str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # as the traceback module says it
        return "<exception str() failed>"
