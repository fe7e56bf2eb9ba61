"""Sphinx configuration: Markdown pages (MyST), built by the tests with
``sphinx-build -W --keep-going -n`` so that a broken reference fails."""

project = "rustccl"
author = "the rustccl authors"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3
html_theme = "alabaster"
html_title = "rustccl"
# External links are not fetched while building (the tests run offline).
linkcheck_ignore = [r"https?://.*"]
