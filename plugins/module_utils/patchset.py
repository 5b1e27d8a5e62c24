# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Unified diffs in pure Python: parse them and apply them in memory, exactly (fuzz 0).

Private to the llmops.inference collection; not a public API. Standard library only, so hosts
need no ``patch`` binary. Supported: several files per diff, the same file more than once,
hunks that moved (offsets), new and deleted files (``/dev/null``), git's ``a/`` and ``b/``
prefixes, headers with timestamps, ``\\ No newline at end of file``, and CRLF files. Refused
with a clear error: binary patches, renames and copies, file mode changes.

Contents are bytes throughout; a line is ``(text, has_newline)`` where only a file's last line
may lack its newline.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

DEV_NULL = "/dev/null"
_HUNK_HEADER = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_UNSUPPORTED = (
    (b"GIT binary patch", "binary patches are not supported"),
    (b"Binary files ", "binary patches are not supported"),
    (b"rename from ", "renames are not supported; delete the old file and create the new one instead"),
    (b"copy from ", "copies are not supported; create the new file instead"),
    (b"old mode ", "file mode changes are not supported"),
)
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "a": "\a", "b": "\b", "f": "\f", "r": "\r", "v": "\v"}


class PatchError(Exception):
    """A patch that cannot be used: malformed, or not matching the file it targets."""


class PatchParseError(PatchError):
    def __init__(self, source: str, line_no: int, reason: str):
        self.source = source
        self.line_no = line_no
        self.reason = reason
        where = f"line {line_no}" if line_no else "whole file"
        super().__init__(f"patch {source} ({where}): {reason}")


class HunkError(PatchError):
    def __init__(self, source: str, target: str, hunk_no: int, header: str, reason: str):
        self.source = source
        self.target = target
        self.hunk_no = hunk_no
        self.reason = reason
        super().__init__(f"patch {source}: hunk #{hunk_no} ({header}) does not apply to {target}: {reason}")


class HunkLine:
    __slots__ = ("kind", "newline", "text")

    def __init__(self, kind: str, text: bytes, newline: bool = True):
        self.kind = kind  # " " context, "-" removed, "+" added
        self.text = text
        self.newline = newline


@dataclass
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: list  # [HunkLine]

    @property
    def header(self) -> str:
        return f"@@ -{self.old_start},{self.old_count} +{self.new_start},{self.new_count} @@"

    @property
    def old_index(self) -> int:
        """0-based index of the hunk's first old line (for a pure insertion: of the line it goes before)."""
        return self.old_start if self.old_count == 0 else self.old_start - 1

    def old_lines(self) -> list:
        return [(line.text, line.newline) for line in self.lines if line.kind != "+"]

    def new_lines(self) -> list:
        return [(line.text, line.newline) for line in self.lines if line.kind != "-"]

    def reversed(self) -> Hunk:
        swap = {" ": " ", "-": "+", "+": "-"}
        lines = [HunkLine(swap[line.kind], line.text, line.newline) for line in self.lines]
        return Hunk(self.new_start, self.new_count, self.old_start, self.old_count, lines)


class FilePatch:
    """The hunks of one file in a diff; paths as written, after git's a/ b/ prefixes are removed."""

    def __init__(self, source: str, old_path: str, new_path: str, hunks: list):
        self.source = source
        self.old_path = old_path
        self.new_path = new_path
        self.hunks = hunks

    @property
    def target(self) -> str:
        return self.old_path if self.new_path == DEV_NULL else self.new_path

    @property
    def creates(self) -> bool:
        return self.old_path == DEV_NULL

    @property
    def deletes(self) -> bool:
        return self.new_path == DEV_NULL

    def reversed(self) -> FilePatch:
        return FilePatch(self.source, self.new_path, self.old_path, [hunk.reversed() for hunk in self.hunks])


def parse_patch(data: bytes, source: str) -> list:
    """Parse a unified diff into FilePatch objects; ``source`` names the patch in error messages."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    patches = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ "):
            patch, i = _parse_file_patch(lines, i, source)
            patches.append(patch)
            continue
        _refuse_stray_line(line, source, i + 1)
        i += 1
    if not patches:
        raise PatchParseError(source, 0, "no unified diff found (expected '--- a/PATH', '+++ b/PATH' and '@@' hunks)")
    return patches


def _parse_file_patch(lines: list, i: int, source: str) -> tuple:
    """(FilePatch, index of the line after it) for the file header at ``lines[i]`` and its hunks."""
    old_path = _header_path(lines[i][4:], source, i + 1)
    new_path = _header_path(lines[i + 1][4:], source, i + 2)
    if old_path == DEV_NULL and new_path == DEV_NULL:
        raise PatchParseError(source, i + 1, "both sides of the file header are /dev/null")
    header_line = i + 1
    i += 2
    hunks = []
    while i < len(lines) and lines[i].startswith(b"@@"):
        hunk, i = _parse_hunk(lines, i, source)
        hunks.append(hunk)
    if not hunks:
        raise PatchParseError(source, header_line, f"file header for {new_path} is not followed by a hunk")
    old_path, new_path = _strip_git_prefixes(old_path, new_path)
    return FilePatch(source, old_path, new_path, hunks), i


def _refuse_stray_line(line: bytes, source: str, number: int) -> None:
    """A line outside a file's hunks that says the patch needs what this parser does not do."""
    for marker, reason in _UNSUPPORTED:
        if line.startswith(marker):
            raise PatchParseError(source, number, reason)
    if line.startswith(b"@@"):
        raise PatchParseError(source, number, "hunk without a '--- PATH' / '+++ PATH' file header")


def _parse_hunk(lines: list, i: int, source: str) -> tuple:
    header_no = i + 1
    match = _HUNK_HEADER.match(lines[i].rstrip(b"\r"))
    if not match:
        raise PatchParseError(source, header_no, f"malformed hunk header {_text(lines[i])!r}")
    old_start, new_start = int(match.group(1)), int(match.group(3))
    old_count = 1 if match.group(2) is None else int(match.group(2))
    new_count = 1 if match.group(4) is None else int(match.group(4))
    body = []
    old_seen = new_seen = 0
    i += 1
    while old_seen < old_count or new_seen < new_count:
        if i >= len(lines):
            raise PatchParseError(
                source,
                header_no,
                f"hunk ends early: {old_count} old and {new_count} new lines announced, "
                f"{old_seen} and {new_seen} found",
            )
        line = lines[i]
        kind = line[:1]
        if kind == b"\\":
            _mark_no_newline(body, source, i + 1)
        elif kind in (b" ", b""):
            # An empty line is a context line whose leading space an editor stripped; GNU patch accepts it too.
            body.append(HunkLine(" ", line[1:]))
            old_seen += 1
            new_seen += 1
        elif kind == b"-":
            body.append(HunkLine("-", line[1:]))
            old_seen += 1
        elif kind == b"+":
            body.append(HunkLine("+", line[1:]))
            new_seen += 1
        else:
            raise PatchParseError(source, i + 1, f"unexpected line inside a hunk: {_text(line)!r}")
        i += 1
    if old_seen != old_count or new_seen != new_count:
        raise PatchParseError(
            source,
            header_no,
            f"hunk announces {old_count} old and {new_count} new lines but holds {old_seen} and {new_seen}",
        )
    if i < len(lines) and lines[i].startswith(b"\\"):
        _mark_no_newline(body, source, i + 1)
        i += 1
    return Hunk(old_start, old_count, new_start, new_count, body), i


def _mark_no_newline(body: list, source: str, line_no: int) -> None:
    if not body:
        raise PatchParseError(source, line_no, "'\\ No newline at end of file' without a line before it")
    body[-1].newline = False


def _header_path(raw: bytes, source: str, line_no: int) -> str:
    raw = raw.rstrip(b"\r")
    if raw.startswith(b'"'):
        return _unquote(_text(raw), source, line_no)
    path = raw.split(b"\t", 1)[0].rstrip(b" ")
    if not path:
        raise PatchParseError(source, line_no, "file header without a path")
    return _text(path)


def _unquote(quoted: str, source: str, line_no: int) -> str:
    """Git's C-style quoting of unusual paths: "a/caf\\303\\251.py"."""
    out = bytearray()
    i = 1
    while i < len(quoted):
        char = quoted[i]
        if char == '"':
            return out.decode("utf-8", "surrogateescape")
        if char != "\\":
            out += char.encode("utf-8", "surrogateescape")
            i += 1
            continue
        nxt = quoted[i + 1 : i + 2]
        if nxt in _ESCAPES:
            out += _ESCAPES[nxt].encode()
            i += 2
        elif re.match(r"[0-7]{3}", quoted[i + 1 : i + 4]):
            out.append(int(quoted[i + 1 : i + 4], 8))
            i += 4
        else:
            raise PatchParseError(source, line_no, f"bad escape in quoted path {quoted}")
    raise PatchParseError(source, line_no, f"unterminated quoted path {quoted}")


def _strip_git_prefixes(old_path: str, new_path: str) -> tuple:
    old_ok = old_path == DEV_NULL or old_path.startswith("a/")
    new_ok = new_path == DEV_NULL or new_path.startswith("b/")
    if not (old_ok and new_ok):
        return old_path, new_path
    return (
        old_path if old_path == DEV_NULL else old_path[2:],
        new_path if new_path == DEV_NULL else new_path[2:],
    )


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def split_lines(data: bytes) -> list:
    parts = data.split(b"\n")
    last = parts.pop()
    lines = [(part, True) for part in parts]
    if last:
        lines.append((last, False))
    return lines


def join_lines(lines: list) -> bytes:
    return b"".join(text + b"\n" if newline else text for text, newline in lines)


def apply_file_patch(file_patch: FilePatch, original: bytes | None) -> bytes | None:
    """The file's content after the patch (None: the patch deletes it); raises HunkError."""
    first = file_patch.hunks[0]
    if file_patch.creates:
        if original:
            raise HunkError(
                file_patch.source,
                file_patch.target,
                1,
                first.header,
                "the patch creates this file but it already exists",
            )
        original = b""
    elif original is None:
        raise HunkError(file_patch.source, file_patch.target, 1, first.header, "the file does not exist")
    lines = split_lines(original)
    out = []
    pos = 0
    offset = 0
    for number, hunk in enumerate(file_patch.hunks, 1):
        old = hunk.old_lines()
        expected = hunk.old_index + offset
        at = _find(lines, old, expected, pos)
        if at is None:
            raise HunkError(
                file_patch.source, file_patch.target, number, hunk.header, _mismatch_reason(lines, old, expected, pos)
            )
        out.extend(lines[pos:at])
        out.extend(hunk.new_lines())
        pos = at + len(old)
        offset = at - hunk.old_index
    out.extend(lines[pos:])
    result = join_lines(out)
    if file_patch.deletes:
        if result:
            raise HunkError(
                file_patch.source,
                file_patch.target,
                len(file_patch.hunks),
                file_patch.hunks[-1].header,
                "the patch deletes this file but content would remain",
            )
        return None
    return result


def _find(lines: list, old: list, expected: int, start: int) -> int | None:
    """Index nearest to ``expected`` (at or after ``start``) where ``old`` matches exactly."""
    if not old:
        return expected if start <= expected <= len(lines) else None
    last = len(lines) - len(old)
    distance = 0
    while True:
        below, above = expected - distance, expected + distance
        if below < start and above > last:
            return None
        for at in (below, above) if distance else (expected,):
            if start <= at <= last and lines[at : at + len(old)] == old:
                return at
        distance += 1


def _mismatch_reason(lines: list, old: list, expected: int, start: int) -> str:
    if not old:
        return f"insertion point line {expected + 1} is past the end of the file ({len(lines)} lines)"
    for index, wanted in enumerate(old):
        at = expected + index
        found = lines[at] if 0 <= at < len(lines) else None
        if found != wanted:
            has = "end of file" if found is None else _show(found)
            return (
                f"its lines were not found anywhere after line {start}; "
                f"at line {at + 1} the patch expects {_show(wanted)} but the file has {has}"
            )
    return f"its lines were not found after line {start} (an earlier hunk already consumed them)"


def _show(line: tuple) -> str:
    text, newline = line
    return repr(_text(text)) + ("" if newline else " (no newline at end)")


def render_diff(rel: str, before: bytes | None, after: bytes | None) -> str:
    """A unified diff of one file's two contents (None: the file does not exist), as ``git diff`` shows it."""
    if b"\0" in (before or b"") or b"\0" in (after or b""):
        return f"Binary file {rel} differs\n"
    lines = difflib.unified_diff(
        _text_lines(before),
        _text_lines(after),
        "/dev/null" if before is None else "a/" + rel,
        "/dev/null" if after is None else "b/" + rel,
    )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _text_lines(data: bytes | None) -> list:
    return [] if data is None else data.decode("utf-8", "replace").splitlines(keepends=True)
