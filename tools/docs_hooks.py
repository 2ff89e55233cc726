"""mkdocs hook: the configuration and log-format reference pages, generated from the code at
every build, so they cannot drift from the keys `ddrl train` accepts and the tables it writes."""
from __future__ import annotations

from mkdocs.structure.files import File

from ddrl.config_docs import reference_markdown
from ddrl.rundir import log


def on_files(files, config):
    files.append(File.generated(config, "reference/configuration.md", content=reference_markdown()))
    files.append(File.generated(config, "reference/log-format.md", content=log.reference_markdown()))
    return files
