# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Secrets out of everything a module returns or prints.

Private to the llmops.inference collection; not a public API. Standard library only.

Use one :class:`Redactor` per module run, built from the secrets the module was given (its ``no_log`` options)::

    redactor = Redactor([params["api_key"]])
    result = redactor.value(result)          # every string in a result, however deeply nested
    message = redactor.text(message)         # one string

It replaces each configured secret wherever it appears (also as Python's ``repr`` and JSON escape it), and
the API-key forms SGLang and HTTP use, whatever their value: ``api_key='...'`` / ``api_key="..."`` (the
engine logs ``server_args=ServerArgs(..., api_key='...')`` at start), ``--api-key X`` / ``--api-key=X``,
``api-key: X`` (its ``--config`` YAML) and ``Authorization: Bearer X``.
"""

from __future__ import annotations

import json
import re

MASK = "********"

_QUOTED = r"""(?P<q>['"])(?P<secret>(?:\\.|(?!(?P=q)).)*)(?P=q)"""
_WORD = r"""(?P<secret>"[^"]*"|'[^']*'|[^\s,;)}\]"']+)"""
_PATTERNS = (
    # api_key='...' and api_key="..." (a Python repr, keyword arguments); admin_api_key too.
    re.compile(r"(?P<lead>\b(?:admin_)?api_key\s*=\s*)" + _QUOTED, re.IGNORECASE),
    # --api-key X, --api-key=X, --admin-api-key X (a command line).
    re.compile(r"(?P<lead>--(?:admin-)?api-key(?:\s+|=))" + _WORD, re.IGNORECASE),
    # api-key: X, api_key: X, "api_key": "X" (YAML, JSON).
    re.compile(r"""(?P<lead>\b(?:admin[_-])?api[_-]key["']?\s*:\s*)""" + _WORD, re.IGNORECASE),
    # Authorization: Bearer X.
    re.compile(r"(?P<lead>\bBearer\s+)" + _WORD, re.IGNORECASE),
)


def _masked(match) -> str:
    quote = match.groupdict().get("q") or ""
    secret = match.group("secret")
    if not quote and len(secret) >= 2 and secret[0] == secret[-1] and secret[0] in "'\"":
        quote = secret[0]  # a quoted value keeps its quotes: 'api_key': '********'
    return f"{match.group('lead')}{quote}{MASK}{quote}"


def _spellings(secret: str) -> list:
    """The secret as it may appear in text: itself, inside a Python repr, inside a JSON string."""
    forms = {secret, repr(secret)[1:-1], json.dumps(secret)[1:-1]}
    return sorted((form for form in forms if form), key=len, reverse=True)


class Redactor:
    """Masks ``secrets`` (strings; empty ones are ignored) and the API-key forms in text and results."""

    def __init__(self, secrets=()):
        forms = set()
        for secret in secrets or ():
            if isinstance(secret, str) and secret:
                forms.update(_spellings(secret))
        self._forms = sorted(forms, key=len, reverse=True)

    def text(self, text: str) -> str:
        for form in self._forms:
            text = text.replace(form, MASK)
        for pattern in _PATTERNS:
            text = pattern.sub(_masked, text)
        return text

    def value(self, value):
        """``value`` with every string in it redacted: dicts (keys and values), lists and tuples are walked."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.value(key): self.value(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.value(item) for item in value)
        return value


def redact(value, secrets=()):
    """One-off form of ``Redactor(secrets).value(value)``."""
    return Redactor(secrets).value(value)
