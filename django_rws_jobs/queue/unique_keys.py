"""The hashes a unique job holds in ``rws_jobs.unique_hash``, whose unique index keeps one live
job per key on every database.

- ``unique_hash``: the key's own, sha256 of the job type and the key; what rust-web-server's
  check is kept in step with (it looks at ``unique_key`` and the status instead).
- ``successor_hash``: the hash a replace's job holds while it waits for a running holder of the
  key (api/enqueue_once.py): one such job per key at most. It takes the key's own hash when it is
  released (workflows/successors.py).
"""

from __future__ import annotations

import hashlib


def unique_hash(job_type: str, unique: str) -> str:
    return hashlib.sha256(f"{job_type}\x00{unique}".encode()).hexdigest()


def successor_hash(digest: str) -> str:
    """The successor hash of the key whose own hash is ``digest``."""
    return hashlib.sha256(f"{digest}\x00next".encode()).hexdigest()
