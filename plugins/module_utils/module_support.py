# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the collection's modules share: option sets with defaults, refused options that name themselves, and
running commands.

Private to the llmops.inference collection; not a public API. Imports nothing of Ansible's: the helpers
that act on an AnsibleModule take it as an argument.
"""

from __future__ import annotations

from contextlib import contextmanager


class OptionError(ValueError):
    """A refused option: ``option`` names it, and the message says what would be accepted."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


class PrefixedOptionError(OptionError):
    """An OptionError whose message starts with the option's name: ``<option>: <message>``."""

    def __init__(self, option: str, message: str):
        super().__init__(option, f"{option}: {message}")


class OptionSet:
    """Options given as keywords, each with its default in the class's ``DEFAULTS``; an unknown one is a
    TypeError. A module hands on ``{name: params[name] for name in DEFAULTS}``."""

    DEFAULTS = {}

    def __init__(self, **options):
        unknown = sorted(set(options) - set(self.DEFAULTS))
        if unknown:
            raise TypeError(f"{type(self).__name__}() got unknown options: {', '.join(unknown)}")
        for name, value in dict(self.DEFAULTS, **options).items():
            setattr(self, name, value)


@contextmanager
def refused_as(option: str, error=OptionError):
    """Re-raise a ValueError from inside as ``error(option, message)``; an OptionError passes unchanged."""
    try:
        yield
    except OptionError:
        raise
    except ValueError as exc:
        raise error(option, str(exc)) from None


def fail_refused_option(module, exc: OptionError) -> None:
    """Fail the task for a refused option, named in the result's ``option``; nothing was changed."""
    module.fail_json(msg=str(exc), option=exc.option, changed=False)


def command_runner(module, **options):
    """``run(args, **kwargs) -> (rc, stdout, stderr)`` through ``module.run_command`` with ``options`` (such as
    ``cwd``) and ``kwargs`` (such as ``data``); a missing executable is a failed command (rc 127), not a crash."""

    def run(args, **kwargs):
        try:
            return module.run_command(args, handle_exceptions=False, **options, **kwargs)
        except OSError as exc:
            return 127, "", str(exc)

    return run
