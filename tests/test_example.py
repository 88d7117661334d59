"""The example shop (example_project/), as scripts/example runs it: its import of a few hundred
rows as a batch with a callback and its chain of jobs, run by an ``rws_worker`` process and seen
in the admin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
SHOP = ROOT / "example_project"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        connection.vendor != "sqlite", reason="SQLite, whatever the run's database: once, in its cells"
    ),
]

pytest.importorskip("django.tasks", reason="the example shop has a django.tasks task (Django 6)")

BEFORE = """
import json, re
from django.contrib.auth import get_user_model
from django.test import Client
from shop.models import Order
get_user_model().objects.create_superuser("admin", "admin@example.com", "admin")
c = Client()
assert c.post("/imports/", {"rows": "300"}).status_code == 302
assert c.post("/orders/shipped/").status_code == 302
c.login(username="admin", password="admin")
order = Order.objects.get(item="kettle").pk
from django_rws_jobs.models import Job
STEPS = ["shop.pack_order", "shop.ship_order", "shop.send_receipt"]
ship = Job.objects.get(job_type="shop.ship_order").pk
pack = Job.objects.get(job_type="shop.pack_order").pk
page = c.get(f"/admin/django_rws_jobs/job/{ship}/change/").content.decode()
dependency = re.search(r'field-dependency_detail(.*?)</div>', page, re.S)
print(json.dumps({
    "order": order,
    "chain": sorted(Job.objects.filter(job_type__in=STEPS).values_list("job_type", "status")),
    "blocked_page": bool(dependency) and pack in dependency.group(1),
    "chunks": Job.objects.filter(job_type="shop.import_rows").count(),
}))
"""

AFTER = """
import json
from django.test import Client
from shop.models import Import, Order, Product
from django_rws_jobs.models import Job
c = Client()
c.login(username="admin", password="admin")
imp = Import.objects.get()
batches = c.get("/admin/django_rws_jobs/batchrecord/").content.decode()
batch = c.get(f"/admin/django_rws_jobs/batchrecord/{imp.batch_id}/change/").content.decode()
home = c.get("/").content.decode()
order = Order.objects.get(item="kettle")
print(json.dumps({
    "products": Product.objects.count(),
    "summary": imp.summary,
    "listed": "import 1: 300 rows" in batches and "finished" in batches,
    "counts": "6 members: 6 succeeded, 0 failed, 0 cancelled, 0 pending" in batch,
    "callback": "on_finish: shop.import_done" in batch,
    "home_bar": '<progress value="6" max="6">' in home,
    "shipped": (order.shipped, order.receipt_sent),
    "left": Job.objects.exclude(job_type="shop.stock_report").count(),
}))
"""


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=SHOP, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_shops_import_batch_and_chain_run_and_show_in_the_admin(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "example.settings",
        "SHOP_DB": str(tmp_path / "shop.sqlite3"),
        "SHOP_IMPORT_ROW_SECONDS": "0",
    }
    manage(env, "migrate", "-v0")
    before = json.loads(manage(env, "shell", "-c", BEFORE).strip().splitlines()[-1])
    assert before["chunks"] == 6  # 300 rows, 50 a job
    # The chain: the first step pending, the next two blocked until the one before succeeds.
    assert before["chain"] == [
        ["shop.pack_order", "pending"],
        ["shop.send_receipt", "blocked"],
        ["shop.ship_order", "blocked"],
    ]
    assert before["blocked_page"]
    manage(env, "rws_worker", "--burst", "--workers", "2")
    after = json.loads(manage(env, "shell", "-c", AFTER).strip().splitlines()[-1])
    assert after == {
        "products": 300,
        "summary": "6 of 6 chunks imported; 300 products",
        "listed": True,
        "counts": True,
        "callback": True,
        "home_bar": True,
        "shipped": [True, True],
        "left": 0,
    }
