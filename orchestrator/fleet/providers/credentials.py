"""A provider's API key, from settings only: ABLATE_<PROVIDER>_API_KEY or a 0600 file named by
ABLATE_<PROVIDER>_API_KEY_FILE. Never from the database, a command line or the SDKs' own lookups
(vastai would fall back to VAST_API_KEY and ~/.config/vastai/vast_api_key; runpod to
~/.runpod/config.toml): the key the operator configured for ablate is the only one used."""

from __future__ import annotations

import stat
from pathlib import Path

from orchestrator.fleet.providers.base import ProviderError
from orchestrator.settings import Settings


class MissingApiKey(ProviderError):
    """No key configured for the provider, or its file is unusable; the message names the variable."""


def api_key(settings: Settings, provider: str) -> str:
    """The key for `provider` ("vast" or "runpod"); MissingApiKey naming the variable and the fix."""
    var = f"ABLATE_{provider.upper()}_API_KEY"
    secret = getattr(settings, f"{provider}_api_key")
    path: Path | None = getattr(settings, f"{provider}_api_key_file")
    if secret is not None and path is not None:
        raise MissingApiKey(f"both {var} and {var}_FILE are set; keep one")
    if secret is not None:
        key = secret.get_secret_value().strip()
    elif path is not None:
        key = _read_key_file(path, f"{var}_FILE")
    else:
        raise MissingApiKey(f"no {provider} API key: set {var}_FILE to a file of mode 0600 holding the key (or {var})")
    if not key or any(c.isspace() for c in key):
        raise MissingApiKey(f"the {provider} API key ({var}) is empty or contains whitespace")
    return key


def _read_key_file(path: Path, var: str) -> str:
    path = path.expanduser()
    try:
        st = path.stat()
    except OSError as exc:
        raise MissingApiKey(f"{var}: cannot read {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise MissingApiKey(f"{var}: {path} is not a regular file")
    if st.st_mode & 0o077:
        # Like ssh with a private key: a key others can read is refused, not used.
        raise MissingApiKey(f"{var}: {path} is readable by others (mode {st.st_mode & 0o777:o}); `chmod 600 {path}`")
    return path.read_text().strip()
