"""The queue overview's charts: jobs done and failed attempts over the last hour and the last day,
from the workers' per-minute counters (metrics.py), drawn as inline SVG on the server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Sum

from ..models import MetricMinute
from ..operations import humanize

WIDTH, HEIGHT = 720, 90


@dataclass
class Bar:
    x: float
    width: float
    done_y: float
    done_h: float
    failed_y: float
    failed_h: float
    title: str


def chart(
    rows: dict[int, tuple[int, int]], start: int, buckets: int, seconds: int, label: str
) -> dict[str, Any]:
    """Bars of ``buckets`` spans of ``seconds`` from ``start``: done (green) under failed (red)."""
    sums = [[0, 0] for _ in range(buckets)]
    for minute, (done, failed) in rows.items():
        i = (minute - start) // seconds
        if 0 <= i < buckets:
            sums[i][0] += done
            sums[i][1] += failed
    top = max((d + f for d, f in sums), default=0) or 1
    width = WIDTH / buckets
    bars = []
    for i, (done, failed) in enumerate(sums):
        done_h = HEIGHT * done / top
        failed_h = HEIGHT * failed / top
        when = humanize.absolute(start + i * seconds)
        bars.append(
            Bar(
                x=round(i * width, 2),
                width=round(max(width - 1, 1), 2),
                done_y=round(HEIGHT - done_h, 2),
                done_h=round(done_h, 2),
                failed_y=round(HEIGHT - done_h - failed_h, 2),
                failed_h=round(failed_h, 2),
                title=f"{when}: {done} done, {failed} failed",
            )
        )
    total = [sum(d for d, _ in sums), sum(f for _, f in sums)]
    return {
        "label": label,
        "bars": bars,
        "top": top,
        "done": total[0],
        "failed": total[1],
        "width": WIDTH,
        "height": HEIGHT,
    }


def charts(at: int, alias: str) -> list[dict[str, Any]]:
    """The last hour by minute and the last day by quarter hour: one statement."""
    now_minute = at - at % 60
    day_start = at - at % 900 - 95 * 900  # 96 quarter hours, the current one last
    rows = {
        r["minute"]: (r["done"] or 0, r["failed"] or 0)
        for r in MetricMinute.objects.using(alias)
        .filter(minute__gte=day_start)
        .values("minute")
        .annotate(done=Sum("done"), failed=Sum("failed"))
        .order_by()
    }
    return [
        chart(rows, now_minute - 59 * 60, 60, 60, "last hour, per minute"),
        chart(rows, day_start, 96, 900, "last day, per 15 minutes"),
    ]
