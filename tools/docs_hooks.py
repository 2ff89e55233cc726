"""mkdocs hook: the configuration reference page, generated from the code at every build, so
it cannot drift from the keys `ddrl train` accepts."""
from __future__ import annotations

from mkdocs.structure.files import File

from ddrl.config_docs import reference_markdown


def on_files(files, config):
    files.append(File.generated(config, "reference/configuration.md", content=reference_markdown()))
    return files
