"""What the modules share: refused options that name themselves, and the command runner."""

from __future__ import annotations

import pytest

from ansible_collections.llmops.inference.plugins.module_utils.module_support import (
    OptionError,
    OptionSet,
    PrefixedOptionError,
    command_runner,
    fail_refused_option,
    refused_as,
)


class RecordingModule:
    """Records run_command and fail_json calls; ``missing`` makes run_command raise as for a missing executable."""

    def __init__(self, missing: bool = False):
        self.missing = missing
        self.calls = []

    def run_command(self, args, **kwargs):
        self.calls.append((args, kwargs))
        if self.missing:
            raise FileNotFoundError(2, "No such file or directory", args[0])
        return 0, "out", ""

    def fail_json(self, **result):
        self.calls.append(("fail_json", result))


def test_command_runner_turns_a_missing_executable_into_a_failed_command():
    module = RecordingModule(missing=True)
    rc, out, err = command_runner(module)(["nvidia-smi", "-L"])
    assert (rc, out) == (127, "")
    assert "No such file or directory" in err
    assert module.calls == [(["nvidia-smi", "-L"], {"handle_exceptions": False})]


def test_command_runner_passes_its_options_and_each_call_s_arguments():
    module = RecordingModule()
    run = command_runner(module, cwd="/")
    assert run(["python3", "-"], data="print(1)") == (0, "out", "")
    assert module.calls == [(["python3", "-"], {"handle_exceptions": False, "cwd": "/", "data": "print(1)"})]


def test_option_errors_name_the_option_with_or_without_a_prefix():
    plain = OptionError("url", "url must be absolute")
    prefixed = PrefixedOptionError("gpus", "unknown GPU '7'")
    assert (plain.option, str(plain)) == ("url", "url must be absolute")
    assert (prefixed.option, str(prefixed)) == ("gpus", "gpus: unknown GPU '7'")
    assert isinstance(prefixed, ValueError)


def test_refused_as_names_the_option_of_a_value_error():
    with pytest.raises(PrefixedOptionError) as raised, refused_as("signal", PrefixedOptionError):
        raise ValueError("unknown signal 'SIGFOO'")
    assert (raised.value.option, str(raised.value)) == ("signal", "signal: unknown signal 'SIGFOO'")


def test_refused_as_lets_an_option_error_and_other_errors_pass_unchanged():
    inner = OptionError("timeout", "timeout must be greater than 0 seconds")
    with pytest.raises(OptionError) as raised, refused_as("url"):
        raise inner
    assert raised.value is inner
    with pytest.raises(TypeError), refused_as("url"):
        raise TypeError("not a value problem")


def test_fail_refused_option_names_the_option_and_changes_nothing():
    module = RecordingModule()
    fail_refused_option(module, OptionError("expect_regex", "expect_regex does not compile"))
    assert module.calls == [
        ("fail_json", {"msg": "expect_regex does not compile", "option": "expect_regex", "changed": False})
    ]


class Knobs(OptionSet):
    DEFAULTS = {"size": 3, "name": None}


def test_an_option_set_fills_in_defaults_and_refuses_unknown_options():
    knobs = Knobs(name="a")
    assert (knobs.size, knobs.name) == (3, "a")
    assert Knobs(size=None).size is None  # an explicit None is kept; the class decides what it means
    with pytest.raises(TypeError, match=r"Knobs\(\) got unknown options: colour, sise"):
        Knobs(sise=4, colour="red")
