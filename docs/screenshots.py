"""Screenshots of three pages of the built site in Chromium (the home page, a how-to guide and a
reference page), and a check that each rendered with its title and the theme's search box:
``python docs/screenshots.py docs/_build/html docs/_build/screenshots``. scripts/docs runs it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

PAGES = {
    "index.html": "django-rws-jobs",
    "howto/deploy.html": "Deploy workers",
    "reference/settings.html": "STATEMENT_DEADLINE",
}


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    sys.exit("screenshots: no Chromium found (scripts/docs installs Debian's chromium)")


def main(html: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    browser = chromium()
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    failed = []
    for page, expected in PAGES.items():
        url = (html / page).resolve().as_uri()
        dom = subprocess.run(
            [*common, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=True
        ).stdout
        if expected not in dom or 'class="sidebar-search' not in dom:
            failed.append(f"{page}: {expected!r} or the search box missing from the rendered page")
        png = out / (page.replace("/", "-").removesuffix(".html") + ".png")
        subprocess.run(
            [*common, "--window-size=1280,1400", f"--screenshot={png}", url],
            capture_output=True,
            timeout=120,
            check=True,
        )
        if not png.exists() or png.stat().st_size < 10_000:
            failed.append(f"{page}: no screenshot")
        print(f"screenshot: {png}")
    if failed:
        sys.exit("\n".join(failed))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
