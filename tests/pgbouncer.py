"""PgBouncer (Debian's package) in transaction mode in front of the test run's PostgreSQL.

``RWS_TEST_POOLER=pgbouncer`` (the dj61:pgbouncer cell of scripts/test) sends the whole run, and
the workers it starts, through one started by tests/conftest.py; tests/test_pooler.py starts its
own in the plain PostgreSQL cell.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"

CONFIG = """\
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = trust
auth_file = {dir}/users.txt
admin_users = {user}
pool_mode = transaction
max_client_conn = 500
default_pool_size = {pool_size}
ignore_startup_parameters = extra_float_digits,options
server_reset_query =
server_check_delay = 0
logfile = {dir}/pgbouncer.log
log_connections = 0
log_disconnections = 0
pidfile = {dir}/pgbouncer.pid
"""


def available() -> bool:
    return os.path.exists(BINARY)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def admin(port: int, command: str) -> list[tuple]:
    """Run ``command`` on the admin console of the PgBouncer on ``port`` (SHOW POOLS, KILL db)."""
    import psycopg

    user = os.environ.get("PGUSER", "postgres")
    with psycopg.connect(host="127.0.0.1", port=port, user=user, dbname="pgbouncer", autocommit=True) as conn:
        cur = psycopg.ClientCursor(conn)
        cur.execute(command)
        return cur.fetchall() if cur.description else []


class PgBouncer:
    """A PgBouncer process on ``port`` in front of PostgreSQL at ``host``:``target_port``."""

    def __init__(self, port: int, target_port: int, host: str = "127.0.0.1", pool_size: int = 20):
        self.port = port
        self.user = os.environ.get("PGUSER", "postgres")
        self.dir = Path(tempfile.mkdtemp(prefix="rws-pgbouncer-"))
        (self.dir / "users.txt").write_text(f'"{self.user}" ""\n')
        config = self.dir / "pgbouncer.ini"
        config.write_text(
            CONFIG.format(
                host=host, port=target_port, listen=port, dir=self.dir, user=self.user, pool_size=pool_size
            )
        )
        # PgBouncer refuses to run as root: as the postgres user then, who must read the folder.
        command = [BINARY, str(config)]
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            for path in self.dir.iterdir():
                shutil.chown(path, "postgres")
            command = ["runuser", "-u", "postgres", "--", *command]
        # (Its stderr repeats the log file: a pipe nobody reads would fill and stop it.)
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited with {self.proc.returncode}: {self.log()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer did not listen on {port} within 10 s: {self.log()}")

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text() if path.exists() else ""

    def admin(self, command: str) -> list[tuple]:
        return admin(self.port, command)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
