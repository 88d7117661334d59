"""Follow docs/tutorial/first-job.md as a reader does: its shell lines run in order and its code
blocks are written where they say, both read from the page (and the snippets its literalinclude
directives name), so the page and what runs cannot drift. tests/test_tutorial.py runs it;
benchmarks/tutorial.py times it."""

from __future__ import annotations

import http.cookiejar
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "tutorial" / "first-job.md"
FENCE = re.compile(r"^```(\{literalinclude\} (?P<include>\S+)|(?P<lang>\w+))\n(?P<body>.*?)^```", re.S | re.M)

# The lines of the page that this runner knows how to run, in order. A line added to the page
# fails the test until it is taught here.
COMMANDS = [
    "python -m venv .venv",
    ". .venv/bin/activate",
    "pip install django-rws-jobs",
    "django-admin startproject mysite .",
    "python manage.py startapp shop",
    "python manage.py migrate",
    "python manage.py runserver",
    "curl -d email=ada@example.com http://127.0.0.1:8000/order/",
    "python manage.py createsuperuser",
    "python manage.py rws_worker --burst",
    "python manage.py rws_worker --workers 4",
]


def include(directive: str, options: str) -> str:
    """The text a literalinclude directive shows (the options the pages use)."""
    text = (PAGE.parent / directive).read_text()
    opts = dict(re.findall(r"^:([\w-]+):[ ]*(.*)$", options, re.M))
    if "start-at" in opts:
        text = text[text.index(opts["start-at"]) :]
    if "end-before" in opts:
        text = text[: text.index(opts["end-before"])]
    return text


def steps() -> Iterator[tuple[str, str]]:
    """("sh", line) for each command, ("file", text) for each included snippet, in page order."""
    for match in FENCE.finditer(PAGE.read_text()):
        if match["include"]:
            yield "file", include(match["include"], match["body"])
        elif match["lang"] == "sh":
            for line in match["body"].splitlines():
                code = line.split(" #")[0].strip()
                if code:
                    yield "sh", code


def file_name(text: str) -> str:
    """Where a snippet goes: its first line names the file ("# shop/jobs.py: ...")."""
    return re.split(r"[:,]", text.splitlines()[0].removeprefix("# "))[0]


def wheel(out: Path) -> Path:
    """Build the package's wheel from a copy of what it is made of (a build in the tree leaves
    build/ behind, whose stale files a later wheel would take)."""
    src = out / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "django_rws_jobs", src / "django_rws_jobs", ignore=shutil.ignore_patterns("__pycache__")
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("django_rws_jobs-*.whl")
    return built


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Tutorial:
    """The page's steps, run one by one in ``project`` (an empty directory) with ``wheel`` standing
    for ``pip install django-rws-jobs``; ``times`` keeps each step's seconds."""

    def __init__(self, project: Path, wheel: Path) -> None:
        self.project, self.wheel = project, wheel
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
        # ``python`` is this test's interpreter, as a reader's shell finds theirs.
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env['PATH']}"
        self.server: subprocess.Popen[str] | None = None
        self.outputs: dict[str, str] = {}
        self.times: list[tuple[str, float]] = []
        self.django_version: tuple[int, ...] = ()

    def run(self, line: str, **kwargs) -> str:
        env = {**self.env, **kwargs.pop("env", {})}
        done = subprocess.run(
            ["bash", "-c", line], cwd=self.project, env=env, capture_output=True, text=True, **kwargs
        )
        if done.returncode:
            raise AssertionError(f"`{line}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done.stdout + done.stderr

    def sh(self, line: str) -> None:
        if line == ". .venv/bin/activate":
            self.run(line)  # (it exists and runs), then what it does, for the steps after it
            venv = self.project / ".venv"
            self.env["VIRTUAL_ENV"] = str(venv)
            self.env["PATH"] = f"{venv / 'bin'}{os.pathsep}{self.env['PATH']}"
        elif line == "pip install django-rws-jobs":
            self.outputs[line] = self.run(f"pip install {self.wheel}")
            version = self.run("python -m django --version").strip()
            self.django_version = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
        elif line == "python manage.py runserver":
            self.server = subprocess.Popen(
                ["python", "manage.py", "runserver", "--noreload", f"127.0.0.1:{self.port}"],
                cwd=self.project,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            self.wait_for_server()
        elif line.startswith("curl "):
            self.outputs[line] = self.run(line.replace("127.0.0.1:8000", f"127.0.0.1:{self.port}"))
        elif line == "python manage.py createsuperuser":
            # The page's reader types a name, an address and a password.
            answers = {"DJANGO_SUPERUSER_USERNAME": "ada", "DJANGO_SUPERUSER_EMAIL": "ada@example.com"}
            self.run(f"{line} --noinput", env={**answers, "DJANGO_SUPERUSER_PASSWORD": "tutorial-pw-1"})
            self.outputs["admin"] = self.admin_page("/admin/django_rws_jobs/job/")
        elif line == "python manage.py rws_worker --burst":
            self.outputs[line] = self.run(line)
            self.outputs["admin after the worker"] = self.admin_page("/admin/django_rws_jobs/job/")
        elif line == "python manage.py rws_worker --workers 4":
            # Runs until Ctrl-C, as the page says: started, then interrupted; it exits cleanly.
            worker = subprocess.Popen(
                ["bash", "-c", f"exec {line}"], cwd=self.project, env=self.env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
            time.sleep(2)
            worker.send_signal(2)
            out = worker.communicate(timeout=60)[0]
            assert worker.returncode == 0, out
            self.outputs[line] = out
        else:
            self.outputs[line] = self.run(line)

    def file(self, text: str) -> None:
        name = file_name(text)
        if name == "settings.py":
            if "on Django 5.2 and 6.0" in text.splitlines()[0] and self.django_version >= (6, 1):
                return  # the page: "On Django 5.2 or 6.0, add this line too"
            target = self.project / "mysite" / "settings.py"
            target.write_text(target.read_text() + "\n" + text)  # the later INSTALLED_APPS replaces
        else:
            (self.project / name).write_text(text)

    def wait_for_server(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.server is not None and self.server.poll() is None, self.stop()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"runserver did not listen: {self.stop()}")

    def admin_page(self, path: str) -> str:
        """The page as the superuser sees it, after logging in through the login form."""
        base = f"http://127.0.0.1:{self.port}"
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        form = opener.open(f"{base}/admin/login/?next={path}", timeout=30).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)[1]  # type: ignore[index]
        data = {"csrfmiddlewaretoken": token, "username": "ada", "password": "tutorial-pw-1", "next": path}
        with opener.open(f"{base}/admin/login/?next={path}", urllib.parse.urlencode(data).encode(), 30) as r:
            assert r.url.endswith(path), f"the login did not lead to {path}: {r.url}"
            return r.read().decode()

    def stop(self) -> str:
        if self.server is None:
            return ""
        if self.server.poll() is None:
            self.server.terminate()
        out = self.server.communicate(timeout=30)[0]
        self.server = None
        return out

    def follow(self) -> None:
        try:
            for kind, value in steps():
                started = time.monotonic()
                self.sh(value) if kind == "sh" else self.file(value)
                self.times.append((value.splitlines()[0], time.monotonic() - started))
        finally:
            self.outputs["runserver"] = self.stop()
