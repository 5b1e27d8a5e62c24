from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from sglang_fixture import SPEC_INFO, WHEEL_VERSION, wheel_path

from ansible_collections.llmops.inference.plugins.module_utils.patchset import (
    HunkError,
    PatchParseError,
    apply_file_patch,
    parse_patch,
    render_diff,
)

REPO = Path(__file__).resolve().parents[4]
EXAMPLE_PATCH = REPO / "docs" / "patches" / "eagle_lab" / "0001-register-llmops-demo-algorithm.diff"

ORIGINAL = b"".join(b"line %d\n" % n for n in range(1, 21))


def apply_all(patch: bytes, files: dict) -> dict:
    result = dict(files)
    for file_patch in parse_patch(patch, "test.diff"):
        result[file_patch.target] = apply_file_patch(file_patch, result.get(file_patch.target))
    return result


def roundtrip(before, after, rel="sglang/x.py"):
    """A diff rendered by render_diff must turn ``before`` into ``after`` and back."""
    text = render_diff(rel, before, after).encode()
    (file_patch,) = parse_patch(text, "rendered.diff")
    assert apply_file_patch(file_patch, before) == after
    assert apply_file_patch(file_patch.reversed(), after) == before


def test_git_diff_with_two_files_strips_prefixes_and_keeps_order():
    patch = b"""diff --git a/sglang/a.py b/sglang/a.py
index 1111111..2222222 100644
--- a/sglang/a.py
+++ b/sglang/a.py
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
diff --git a/sglang/b.py b/sglang/b.py
--- a/sglang/b.py
+++ b/sglang/b.py
@@ -1 +1,2 @@
 x
+y
"""
    patches = parse_patch(patch, "two.diff")
    assert [p.target for p in patches] == ["sglang/a.py", "sglang/b.py"]
    assert (patches[1].hunks[0].old_count, patches[1].hunks[0].new_count) == (1, 2)
    result = apply_all(patch, {"sglang/a.py": b"one\ntwo\nthree\n", "sglang/b.py": b"x\n"})
    assert result == {"sglang/a.py": b"one\nTWO\nthree\n", "sglang/b.py": b"x\ny\n"}


def test_plain_diff_u_headers_with_timestamps_keep_the_path():
    patch = (
        b"--- sglang/a.py.orig\t2026-11-29 16:26:56.085408574 +0000\n"
        b"+++ sglang/a.py\t2026-11-29 16:26:56.209472025 +0000\n"
        b"@@ -1 +1 @@\n-old\n+new\n"
    )
    (file_patch,) = parse_patch(patch, "diffu.diff")
    assert file_patch.target == "sglang/a.py"
    assert apply_file_patch(file_patch, b"old\n") == b"new\n"


def test_quoted_git_path_is_unescaped():
    patch = b'--- "a/sglang/caf\\303\\251.py"\n+++ "b/sglang/caf\\303\\251.py"\n@@ -1 +1 @@\n-a\n+b\n'
    (file_patch,) = parse_patch(patch, "quoted.diff")
    assert file_patch.target == "sglang/caf\u00e9.py"


def test_hunk_found_at_an_offset_and_later_hunks_follow_it():
    patch = b"""--- a/f
+++ b/f
@@ -3,3 +3,3 @@
 line 3
-line 4
+LINE 4
 line 5
@@ -15,3 +15,3 @@
 line 15
-line 16
+LINE 16
 line 17
"""
    shifted = b"new a\nnew b\nnew c\n" + ORIGINAL
    result = apply_all(patch, {"f": shifted})["f"]
    assert result == shifted.replace(b"line 4\n", b"LINE 4\n").replace(b"line 16\n", b"LINE 16\n")


def test_context_that_does_not_match_exactly_fails_naming_patch_file_and_hunk():
    patch = b"""--- a/sglang/f.py
+++ b/sglang/f.py
@@ -1,3 +1,3 @@
 line 1
-line 2
+LINE 2
 line 3
@@ -10,3 +10,3 @@
 line 10
-line 11 changed upstream
+LINE 11
 line 12
"""
    (file_patch,) = parse_patch(patch, "0002-fix.diff")
    with pytest.raises(HunkError) as caught:
        apply_file_patch(file_patch, ORIGINAL)
    message = str(caught.value)
    assert "0002-fix.diff" in message and "sglang/f.py" in message and "hunk #2" in message
    assert "'line 11 changed upstream'" in message and "'line 11'" in message
    assert caught.value.hunk_no == 2


def test_no_fuzz_one_differing_context_line_is_enough_to_refuse():
    patch = b"--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n line 1\n-line 2\n+x\n line 3 \n"
    (file_patch,) = parse_patch(patch, "fuzzy.diff")
    with pytest.raises(HunkError):
        apply_file_patch(file_patch, ORIGINAL)


def test_new_file_from_dev_null_and_refused_when_it_exists():
    patch = b"--- /dev/null\n+++ b/sglang/new.py\n@@ -0,0 +1,2 @@\n+a = 1\n+b = 2\n"
    (file_patch,) = parse_patch(patch, "new.diff")
    assert file_patch.creates and file_patch.target == "sglang/new.py"
    assert apply_file_patch(file_patch, None) == b"a = 1\nb = 2\n"
    with pytest.raises(HunkError, match="already exists"):
        apply_file_patch(file_patch, b"something\n")


def test_deleted_file_to_dev_null_yields_none():
    patch = b"--- a/sglang/old.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a = 1\n-b = 2\n"
    (file_patch,) = parse_patch(patch, "del.diff")
    assert file_patch.deletes and file_patch.target == "sglang/old.py"
    assert apply_file_patch(file_patch, b"a = 1\nb = 2\n") is None
    with pytest.raises(HunkError, match="does not exist"):
        apply_file_patch(file_patch, None)


def test_no_newline_at_end_of_file_markers():
    add_newline = b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n"
    assert apply_all(add_newline, {"f": b"a\nb"})["f"] == b"a\nb\n"
    drop_newline = b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+b\n\\ No newline at end of file\n"
    assert apply_all(drop_newline, {"f": b"a\nb\n"})["f"] == b"a\nb"
    # The marker matters when matching: "b" without newline is not "b\n".
    with pytest.raises(HunkError):
        apply_all(add_newline, {"f": b"a\nb\n"})


def test_same_file_twice_in_one_diff_applies_in_sequence():
    patch = b"--- a/f\n+++ b/f\n@@ -1 +1 @@\n-x\n+y\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-y\n+z\n"
    assert apply_all(patch, {"f": b"x\n"})["f"] == b"z\n"


def test_crlf_files_keep_their_line_endings():
    patch = b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\r\n-b\r\n+c\r\n"
    assert apply_all(patch, {"f": b"a\r\nb\r\n"})["f"] == b"a\r\nc\r\n"


def test_context_line_whose_space_an_editor_stripped_still_counts():
    patch = b"--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n\n-b\n+c\n"
    assert apply_all(patch, {"f": b"a\n\nb\n"})["f"] == b"a\n\nc\n"


def test_pure_insertion_without_context():
    patch = b"--- a/f\n+++ b/f\n@@ -2,0 +3 @@\n+inserted\n"
    assert apply_all(patch, {"f": b"one\ntwo\nthree\n"})["f"] == b"one\ntwo\ninserted\nthree\n"


def test_reversed_patch_undoes_it():
    patch = b"--- a/f\n+++ b/f\n@@ -1,3 +1,4 @@\n line 1\n-line 2\n+two\n+two bis\n line 3\n"
    (file_patch,) = parse_patch(patch, "r.diff")
    patched = apply_file_patch(file_patch, ORIGINAL)
    assert apply_file_patch(file_patch.reversed(), patched) == ORIGINAL


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (ORIGINAL, ORIGINAL.replace(b"line 7\n", b"seven\n").replace(b"line 19\n", b"")),
        (b"a\nb", b"a\nc"),
        (b"a\nb", b"a\nb\n"),
        (None, b"new file\n"),
        (b"gone\n", None),
    ],
)
def test_render_diff_roundtrips_through_parse_and_apply(before, after):
    roundtrip(before, after)


@pytest.mark.parametrize(
    ("patch", "reason"),
    [
        (b"just some text\n", "no unified diff found"),
        (b"--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n", "hunk ends early"),
        (b"--- a/f\n+++ b/f\n@@ broken @@\n-a\n", "malformed hunk header"),
        (b"--- a/f\n+++ b/f\n@@ -1 +1 @@\n?a\n", "unexpected line inside a hunk"),
        (b"--- a/f\n+++ b/f\nnot a hunk\n", "not followed by a hunk"),
        (b"diff --git a/f b/f\nGIT binary patch\nliteral 3\n", "binary patches are not supported"),
        (b"diff --git a/f b/g\nsimilarity index 100%\nrename from f\nrename to g\n", "renames are not supported"),
        (b"@@ -1 +1 @@\n-a\n+b\n", "without a '--- PATH'"),
        (b"--- /dev/null\n+++ /dev/null\n@@ -0,0 +0,0 @@\n", "both sides"),
    ],
)
def test_malformed_or_unsupported_patches_are_refused_with_the_reason(patch, reason):
    with pytest.raises(PatchParseError, match=reason) as caught:
        parse_patch(patch, "bad.diff")
    assert "bad.diff" in str(caught.value)


def test_example_patch_set_applies_to_the_real_spec_info_and_compiles():
    wheel = wheel_path()
    if wheel is None:
        pytest.skip(f"the sglang {WHEEL_VERSION} wheel is not available")
    with zipfile.ZipFile(wheel) as archive:
        original = archive.read(SPEC_INFO)
    (file_patch,) = parse_patch(EXAMPLE_PATCH.read_bytes(), EXAMPLE_PATCH.name)
    assert file_patch.target == SPEC_INFO
    patched = apply_file_patch(file_patch, original)
    assert b"    LLMOPS_DEMO = auto()\n" in patched
    assert b"            SpeculativeAlgorithm.LLMOPS_DEMO,\n" in patched
    compile(patched, SPEC_INFO, "exec", dont_inherit=True)
    assert apply_file_patch(file_patch.reversed(), patched) == original
