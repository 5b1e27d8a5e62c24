"""A stand-in for the `ninja` command the ninja wheel puts in a venv's bin/ (sglang 0.5.23 depends on it).

SGLang's JIT kernels run a bare `ninja -f build.ninja` in a staging directory
(sglang/kernels/jit/utils/compile/ninja.py). This reads that build file and makes its outputs (placeholder
objects, their depfiles, the module) without compiling anything: what the lab needs is the command, found
or not found on PATH, not a compiler. Standard library only; `lab up` installs it as /opt/sglang/venv/bin/ninja.
"""

import os
import sys

VERSION = "1.13.0"


def _fail(message):
    print(f"ninja: error: {message}", file=sys.stderr)
    return 1


def _statements(text):
    builds, defaults = [], []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "build" and words[1].endswith(":"):
            builds.append((words[1][:-1], words[2], words[3:]))
        elif words[:1] == ["default"]:
            defaults.extend(words[1:])
    return builds, defaults


def main(argv):
    build_file, directory = "build.ninja", None
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--version":
            print(VERSION)
            return 0
        if arg in ("-f", "-C", "-j") and args:
            value = args.pop(0)
            if arg == "-f":
                build_file = value
            elif arg == "-C":
                directory = value
        elif arg.startswith("-"):
            return _fail(f"unknown option {arg!r} (this stand-in knows -f, -C, -j and --version)")
    if directory:
        os.chdir(directory)
    try:
        with open(build_file, encoding="utf-8") as handle:
            builds, _defaults = _statements(handle.read())
    except OSError as exc:
        return _fail(f"loading '{build_file}': {exc.strerror}")
    made = set()
    for step, (output, rule, inputs) in enumerate(builds, start=1):
        for item in inputs:
            if item not in made and not os.path.exists(item):
                return _fail(f"'{item}', needed by '{output}', missing and no known rule to make it")
        with open(output, "w", encoding="utf-8") as handle:
            handle.write(f"simulated {rule} output of {' '.join(inputs)}\n")
        if rule.startswith("compile"):
            with open(f"{output}.d", "w", encoding="utf-8") as handle:
                handle.write(f"{output}: {' '.join(os.path.abspath(i) for i in inputs)}\n")
        made.add(output)
        print(f"[{step}/{len(builds)}] {rule} {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
