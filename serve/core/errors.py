"""One error hierarchy: every error draftsmith raises for something the user can act on is a DraftsmithError,
and the CLI prints it as `error: <message>` on one line and exits with code 2 (scripts/cli/__init__.py).

The subclasses say where it came from; those of one module live beside it (data.cache.CacheError,
data.prompts.PromptFormatError, serve.drafters.DrafterSpecError, serve.export.common.ExportError, ...);
the ones shared across the packages live here.
"""


class DraftsmithError(ValueError):
    """Something the user can fix; the message names what is wrong and what to do."""


class ConfigError(DraftsmithError):
    """A config file, flag or override the user can fix; the message names the key and the valid ones."""


class TargetError(DraftsmithError):
    """A target that cannot be loaded or used as asked; the message says why and what to do."""


class FetchError(DraftsmithError, RuntimeError):
    """The embedded default target could not be built (download, checksum, conversion); says what to do."""
