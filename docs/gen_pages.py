"""mkdocs-gen-files script: writes the pages generated from the code (see tools/docs_pages.py)."""

import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from docs_pages import config_reference, method_pages, report_files
from graphfed import catalogue

with mkdocs_gen_files.open("reference/config.md", "w") as page:
    page.write(config_reference())
for path, text in method_pages(catalogue.load()).items():
    with mkdocs_gen_files.open(path, "w") as page:
        page.write(text)
for path, content in report_files().items():
    with mkdocs_gen_files.open(path, "wb") as page:
        page.write(content)
