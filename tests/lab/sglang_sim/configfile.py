"""`--config FILE.yaml`: sglang/srt/utils/server_args_config_parser.py `ConfigArgumentMerger`, in the standard library.

The real merger (prepare_server_args in sglang/srt/server_args.py) runs only when a literal `--config`
token is in argv (`--config=FILE` is parsed as a flag and ignored); it refuses more than one `--config`,
a last `--config` without a path, a path not ending in .yaml/.yml, a missing file, and a document that is not
a mapping (ValueError, so the launch ends with a traceback). Each key becomes `--KEY` spelled exactly as
written (so `api_key:` becomes `--api_key`, which argparse does not know: only `api-key:` works); booleans
are `--KEY` for store_true flags (false: nothing) and `--KEY true|false` otherwise; lists are `--KEY a b`;
anything else `--KEY str(value)` (YAML null becomes the string "None"). The config's arguments go first,
so the command line wins.

PyYAML's safe_load is replaced by a reader of what such a file holds: flat `key: value` lines, comments,
quoted or plain scalars (YAML 1.1 booleans, null, ints, floats) and lists (flow `[a, b]` or block `- a`).
Anything else (nested mappings, anchors, multi-line strings, several documents) is refused with the file and
line, rather than read differently from PyYAML.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

BOOL_TRUE = {"yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"}
BOOL_FALSE = {"no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"}
NULLS = {"", "~", "null", "Null", "NULL"}
INT = re.compile(r"[-+]?(0|[1-9][0-9_]*)\Z")
HEX = re.compile(r"[-+]?0x[0-9a-fA-F_]+\Z")
FLOAT = re.compile(r"[-+]?([0-9][0-9_]*)?\.[0-9_]*([eE][-+][0-9]+)?\Z")
KEY = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.-]*)\s*:(?:\s+|\Z)(.*)\Z")


class UnsupportedYaml(ValueError):
    """The file uses YAML the simulator does not read."""


def _unsupported(path: str, number: int, what: str) -> UnsupportedYaml:
    return UnsupportedYaml(f"sglang_sim reads flat 'key: value' YAML config files only; {path} line {number}: {what}")


def _strip_comment(text: str) -> str:
    quote = None
    for index, char in enumerate(text):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or text[index - 1] in " \t"):
            return text[:index].rstrip()
    return text.rstrip()


def _scalar(text: str, path: str, number: int):
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        inner = text[1:-1]
        if text[0] == "'":
            return inner.replace("''", "'")
        if "\\" in inner:
            raise _unsupported(path, number, "escape sequences in double-quoted strings")
        return inner
    first = text[:1]
    if first and first in "'\"":
        raise _unsupported(path, number, "an unterminated quoted string")
    if first and first in "&*!|>{@`%":
        raise _unsupported(path, number, f"{text[:1]!r} (anchors, tags, block scalars, mappings)")
    if text in NULLS:
        return None
    if text in BOOL_TRUE:
        return True
    if text in BOOL_FALSE:
        return False
    if INT.match(text):
        return int(text.replace("_", ""))
    if HEX.match(text):
        return int(text.replace("_", ""), 16)
    if FLOAT.match(text) and text not in (".", "+.", "-."):
        return float(text.replace("_", ""))
    if text in (".inf", ".Inf", ".INF", "+.inf"):
        return float("inf")
    if text in ("-.inf", "-.Inf", "-.INF"):
        return float("-inf")
    if text in (".nan", ".NaN", ".NAN"):
        return float("nan")
    if ": " in text or text.endswith(":"):
        raise _unsupported(path, number, "a nested mapping")
    return text


def _flow_list(text: str, path: str, number: int) -> list:
    inner = text.strip()[1:-1].strip()
    if not inner:
        return []
    if any(char in inner for char in "[]{}"):
        raise _unsupported(path, number, "nested flow collections")
    return [_scalar(item, path, number) for item in inner.split(",")]


def load(path: str) -> dict:
    """The mapping a flat YAML config file holds; UnsupportedYaml for what PyYAML might read otherwise."""
    data: dict = {}
    open_key: str | None = None  # a `key:` with no value on its line: null, or the block list below it
    documents = 0
    for number, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        line = _strip_comment(raw)
        if not line.strip():
            continue
        stripped = line.strip()
        if stripped in ("---", "...") and not line[:1].isspace():
            documents += 1
            if data or documents > 1:
                raise _unsupported(path, number, "more than one YAML document")
            continue
        if stripped == "-" or stripped.startswith("- "):
            if open_key is None:
                raise _unsupported(path, number, "a list item that belongs to no key")
            if data[open_key] is None:
                data[open_key] = []
            data[open_key].append(_scalar(stripped[1:], path, number))
            continue
        if line[:1].isspace():
            raise _unsupported(path, number, "indented content (nested mappings or multi-line values)")
        match = KEY.match(line)
        if not match:
            raise _unsupported(path, number, f"{stripped!r} is not 'key: value'")
        key, value = match.group(1), match.group(2).strip()
        if key in data:
            raise _unsupported(path, number, f"duplicate key {key!r}")
        open_key = key if value == "" else None
        if value.startswith("["):
            if not value.endswith("]"):
                raise _unsupported(path, number, "a flow list that spans lines")
            data[key] = _flow_list(value, path, number)
        else:
            data[key] = _scalar(value, path, number)
    return data


def _config_file_path(argv: list[str]) -> str | None:
    indices = [i for i, arg in enumerate(argv) if arg == "--config"]
    if len(indices) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    if not indices:
        return None
    if indices[0] == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    return argv[indices[0] + 1]


def merge(argv: list[str], store_true_keys: set[str]) -> list[str]:
    """argv with the config file's arguments first (ConfigArgumentMerger.merge_config_with_args)."""
    config_path = _config_file_path(argv)
    if not config_path:
        return argv
    path = Path(config_path)
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        raise ValueError(f"Config file not found: {config_path}")
    data = load(config_path)
    config_args: list[str] = []
    for key, value in data.items():
        normalized = key.replace("-", "_")
        if isinstance(value, bool):
            if normalized in store_true_keys:
                if value:
                    config_args.append(f"--{key}")
            else:
                config_args.extend([f"--{key}", str(value).lower()])
        elif isinstance(value, list):
            if value:
                config_args.append(f"--{key}")
                config_args.extend(str(item) for item in value)
        elif isinstance(value, dict):
            config_args.extend([f"--{key}", json.dumps(value)])
        else:
            config_args.extend([f"--{key}", str(value)])
    index = argv.index("--config")
    return config_args + argv[:index] + argv[index + 2 :]
