"""The peers' side of benchmarks/peers.py, run in .venv/peers: each module enqueues its jobs
when run as a script, and its handler writes its start time (stamps.py)."""
