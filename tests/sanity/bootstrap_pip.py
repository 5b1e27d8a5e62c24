"""Give ansible-test a pip bootstrap script when its download host cannot be reached.

``ansible-test sanity --requirements`` downloads ``get-pip-<version>.py`` from Ansible's CI file
host into ``~/.ansible/test/cache``. Where that host is unreachable (only package registries are),
this places a stand-in that bootstraps pip with ``ensurepip`` and installs the requested packages
from the machine's configured index. With internet access the real script is downloaded instead
and nothing is written here.
"""

from __future__ import annotations

import os
import re
import sys
import urllib.request
from pathlib import Path

import ansible_test

STAND_IN = '''"""Stand-in for get-pip.py: ensurepip, then pip install the given arguments."""
import os
import subprocess
import sys

subprocess.run([sys.executable, "-m", "ensurepip", "--upgrade"], check=True, stdout=subprocess.DEVNULL)
env = dict(os.environ)
env.pop("PIP_CONFIG_FILE", None)  # ensurepip sets it to /dev/null; keep the machine's index and CA settings
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.run([sys.executable, "-m", "pip", "install", *args], env=env).returncode)
'''


def pip_version() -> str:
    source = Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py"
    match = re.search(r"pip='([0-9.]+)'", source.read_text())
    if not match:
        sys.exit(f"cannot find ansible-test's pip version in {source}")
    return match.group(1)


def main() -> int:
    version = pip_version()
    cache = Path(os.path.expanduser(f"~/.ansible/test/cache/get_pip_{version.replace('.', '_')}.py"))
    if cache.exists():
        return 0
    cache.parent.mkdir(parents=True, exist_ok=True)
    url = f"https://ci-files.testing.ansible.com/ansible-test/get-pip-{version}.py"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            cache.write_bytes(response.read())
        return 0
    except OSError as exc:
        print(f"cannot download {url} ({exc}); using an ensurepip stand-in at {cache}", file=sys.stderr)
    cache.write_text(STAND_IN)
    return 0


if __name__ == "__main__":
    sys.exit(main())
