"""Paginators for lists of a million rows: counts that stop at a number of rows or at a time limit."""

from __future__ import annotations

from functools import cached_property
from typing import Any, cast

from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet

from ..database.backends import backend_for
from .common import COUNT_CAP

#: How long a list's count may take (seconds) before the list counts fewer rows.
COUNT_SECONDS = 0.1


class CappedCountPaginator(Paginator):
    """Counts at most COUNT_CAP + 1 rows, so that a page of a million-row list reads a page's
    worth, not the whole table (the count took longer than the rest of the page)."""

    cap = COUNT_CAP

    @cached_property
    def count(self) -> int:
        return cast(QuerySet[Any], self.object_list).order_by()[: self.cap + 1].count()

    @property
    def capped(self) -> bool:
        return self.count > self.cap


class TimedCountPaginator(Paginator):
    """The exact count when the database gives it within COUNT_SECONDS; past that, a count that
    stops at ``cap`` rows (within the same time), past that one that stops a row after the first
    page. An exact count reads every matching row, and a filter that few rows of a big
    status match (100,000 dead jobs, one job type in ten) read them all one by one on
    MariaDB (tests/test_admin_input.py::test_a_slow_count_gives_way_to_a_capped_one)."""

    seconds = COUNT_SECONDS
    cap = 1_000
    capped = False

    @cached_property
    def count(self) -> int:
        rows = cast(QuerySet[Any], self.object_list).order_by()
        backend = backend_for(connections[rows.db])
        count = backend.count_within(rows, self.seconds)
        if count is not None:
            return count
        self.cap = max(self.cap, self.per_page)  # fewer would show every row on one page
        count = backend.count_within(rows[: self.cap + 1], self.seconds)
        if count is None:
            self.cap = self.per_page  # a page's worth, which the page itself reads anyway
            count = int(rows[: self.cap + 1].count())
        self.capped = count > self.cap
        return count
