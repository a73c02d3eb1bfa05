"""Screenshots of the documentation site as a reader sees it: ``python tools/screenshots.py`` builds the site and
has headless Chromium (``chromium`` on the PATH, e.g. Debian's package) draw four pages into docs/screenshots/.

The pages are the ones a reader meets first or that break most easily: the home page, a method page (generated
from the registry), the config reference (a wide generated table) and the reproduction report (tables and plots).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "screenshots"
PAGES = {"home": "", "method-panacea": "reference/methods/panacea/", "config-reference": "reference/config/",
         "reproduction-report": "reports/paper/report/"}
WINDOW = "1280,1800"


def main() -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        sys.exit("error: no chromium on the PATH (Debian: apt-get install chromium)")
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        site = Path(scratch) / "site"
        env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
        subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir", str(site)],
                       cwd=ROOT, env=env, check=True, capture_output=True)
        for name, path in PAGES.items():
            target = OUT / f"{name}.png"
            subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            "--disable-background-networking", "--disable-component-update", "--disable-sync",
                            "--no-first-run", f"--user-data-dir={scratch}/profile", f"--window-size={WINDOW}",
                            f"--screenshot={target}", (site / path / "index.html").as_uri()],
                           check=True, capture_output=True, timeout=120)
            print(f"wrote {target.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
