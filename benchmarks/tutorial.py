"""The first hour, timed: a fresh virtualenv to the first job by following the tutorial
(tests/tutorial.py, from the built wheel), then, in that virtualenv, the package's import time and
a ``rws_worker --burst`` on an empty queue, each the median of a few runs.

    python benchmarks/tutorial.py [--repeat 3] [--tree DIR]

``--tree`` times the import and the empty burst of another checkout's package (a worktree of an
older commit) in the same project, its wheel installed over this one's.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import tutorial  # noqa: E402


def seconds(project: Path, argv: list[str], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(argv, cwd=project, check=True, capture_output=True)
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def import_ms(python: Path, project: Path, repeat: int) -> float:
    """``import django_rws_jobs``'s cumulative time (-X importtime), median, in milliseconds."""
    runs = []
    for _ in range(repeat):
        err = subprocess.run(
            [str(python), "-X", "importtime", "-c", "import django_rws_jobs"],
            cwd=project,
            check=True,
            capture_output=True,
            text=True,
        ).stderr
        line = next(li for li in err.splitlines() if li.rstrip().endswith("| django_rws_jobs"))
        runs.append(int(re.split(r"\|", line)[1]) / 1000)
    return statistics.median(runs)


def measure(project: Path, repeat: int) -> dict[str, float]:
    python = project / ".venv" / "bin" / "python"
    setup = "import django; django.setup()"
    env_setup = ["env", "DJANGO_SETTINGS_MODULE=mysite.settings", str(python), "-c", setup]
    return {
        "import django_rws_jobs (ms, -X importtime)": import_ms(python, project, repeat),
        "python -c 'django.setup()' (s)": seconds(project, env_setup, repeat),
        "rws_worker --burst, empty queue (s)": seconds(
            project, [str(python), "manage.py", "rws_worker", "--burst"], repeat
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tree", type=Path, help="also measure this checkout's package")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "wheel").mkdir()
        (work / "project").mkdir()
        started = time.perf_counter()
        built = tutorial.wheel(work / "wheel")
        wheel_s = time.perf_counter() - started
        run = tutorial.Tutorial(work / "project", built)
        run.follow()
        print(f"wheel built in {wheel_s:.1f} s; Django {'.'.join(map(str, run.django_version))}")
        total = 0.0
        for step, took in run.times:
            total += took
            print(f"  {took:6.2f} s  {step}")
            if step == "python manage.py rws_worker --burst":
                print(f"fresh virtualenv to the first job run: {total:.1f} s")
        project = work / "project"
        for name, value in measure(project, args.repeat).items():
            print(f"this tree: {name}: {value:.3f}")
        if args.tree:
            (work / "other").mkdir()
            other = tutorial.ROOT, args.tree.resolve()
            tutorial.ROOT = other[1]
            try:
                old = tutorial.wheel(work / "other")
            finally:
                tutorial.ROOT = other[0]
            subprocess.run(
                [str(project / ".venv/bin/pip"), "install", "-q", "--no-deps", "--force-reinstall", str(old)],
                check=True,
            )
            for name, value in measure(project, args.repeat).items():
                print(f"{args.tree}: {name}: {value:.3f}")


if __name__ == "__main__":
    main()
