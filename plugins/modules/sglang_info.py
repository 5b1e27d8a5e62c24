#!/usr/bin/python
# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_info
short_description: Check that an interpreter can run SGLang - the package, its version, the Python version
version_added: 0.2.0
description:
  - Asks the interpreter O(python) (usually a venv's C(bin/python)) where its C(sglang) package is, which version is
    installed and which Python it is, by running a short standard-library script under it with C(-E);
    C(importlib.util.find_spec) locates the package without importing it (a real C(import sglang) needs torch and a
    GPU stack, which a host being prepared may not have yet).
  - Fails, naming O(label) and what is needed, when the interpreter cannot be run, has no C(sglang), is older than
    O(min_python), has another sglang than O(version), or lacks the C(sglang) console script beside it
    (O(require_script)).
author:
  - llmops.inference contributors (@llmops)
attributes:
  check_mode:
    support: full
    description: Only reads; runs the same in check mode.
extends_documentation_fragment:
  - llmops.inference.read_only
options:
  python:
    description: The absolute path of the interpreter that runs SGLang.
    type: path
    required: true
  version:
    description: The sglang version that must be installed (exactly, as in its dist-info). Empty accepts any.
    type: str
    default: ""
  min_python:
    description: The oldest Python the installed sglang supports (sglang 0.5.23 requires 3.11).
    type: str
    default: "3.11"
  require_script:
    description: Also require the C(sglang) console script (C(sglang serve)) in the interpreter's directory.
    type: bool
    default: false
  label:
    description: How messages name the interpreter, such as the variable it comes from.
    type: str
    default: python
"""

EXAMPLES = r"""
- name: The engine's interpreter runs sglang 0.5.23
  llmops.inference.sglang_info:
    python: /opt/sglang/venv/bin/python
    version: 0.5.23
    require_script: true
    label: sglang_service_python
  register: sglang
"""

RETURN = r"""
python:
  description: The interpreter.
  returned: always
  type: str
  sample: /opt/sglang/venv/bin/python
python_version:
  description: Its Python version.
  returned: when the interpreter ran
  type: str
  sample: 3.11.2
version:
  description: The installed sglang version.
  returned: when sglang is installed
  type: str
  sample: 0.5.23
package_dir:
  description: Where the interpreter finds the sglang package.
  returned: when sglang is installed
  type: str
  sample: /opt/sglang/venv/lib/python3.11/site-packages/sglang
script:
  description: The C(sglang) console script beside the interpreter, or null when there is none.
  returned: when sglang is installed
  type: str
  sample: /opt/sglang/venv/bin/sglang
"""

import os  # noqa: E402 - Ansible modules import after their docs

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.llmops.inference.plugins.module_utils.module_support import command_runner  # noqa: E402
from ansible_collections.llmops.inference.plugins.module_utils.sglang_install import (  # noqa: E402
    InstallError,
    TargetPython,
)

ARGUMENT_SPEC = dict(
    python=dict(type="path", required=True),
    version=dict(type="str", default=""),
    min_python=dict(type="str", default="3.11"),
    require_script=dict(type="bool", default=False),
    label=dict(type="str", default="python"),
)


def _version_tuple(text: str) -> tuple:
    parts = []
    for part in text.split("."):
        digits = "".join(char for char in part if char.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def inspect_install(params: dict, run_command) -> tuple:
    """``(facts, problem)``: what the interpreter has, and the first requirement it misses (None when it has all)."""
    python, label = params["python"], params["label"]
    facts = {"python": python}
    try:
        install = TargetPython(run_command, python).locate()
    except InstallError as exc:
        return facts, f"{label} {python} cannot run SGLang: {exc}"
    facts.update(python_version=install.python_version, version=install.version, package_dir=install.package_dir)
    script = os.path.join(os.path.dirname(python), "sglang")
    facts["script"] = script if os.access(script, os.X_OK) else None
    minimum = params["min_python"]
    if minimum and _version_tuple(install.python_version)[:2] < _version_tuple(minimum)[:2]:
        return facts, (
            f"{label} {python} is Python {install.python_version}; sglang needs Python >= {minimum}: give the "
            "interpreter of an environment built on a newer Python"
        )
    if params["version"] and install.version != params["version"]:
        return facts, f"{label} {python} has sglang {install.version}, but version {params['version']} is required"
    if params["require_script"] and facts["script"] is None:
        return facts, (
            f"{label} {python} has sglang {install.version} but no executable {script} (the console script that "
            "`sglang serve` runs); reinstall sglang in that environment with pip"
        )
    return facts, None


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    facts, problem = inspect_install(module.params, command_runner(module))
    if problem:
        module.fail_json(msg=problem, changed=False, **facts)
    module.exit_json(msg=f"sglang {facts['version']} on Python {facts['python_version']}", changed=False, **facts)


if __name__ == "__main__":
    main()
