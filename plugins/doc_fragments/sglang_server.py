# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    # How a module reaches an SGLang server; the argument spec is sglang.server_argument_spec().
    DOCUMENTATION = r"""
options:
  url:
    description:
      - Base URL of the SGLang server (its C(--host) and C(--port)), as the module reaches it from the host it runs
        on.
    type: str
    default: http://127.0.0.1:30000
  api_key:
    description:
      - "The server's C(--api-key), sent as C(Authorization: Bearer <key>)."
    type: str
  validate_certs:
    description:
      - Verify the server's TLS certificate for an C(https) O(url).
    type: bool
    default: true
"""
