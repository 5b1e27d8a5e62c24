"""Installed on test labs' hosts (``lab up --cache-module-code``): a cache of the compiled code of modules that
Python imports from zip files, which is how every Ansible task runs its module (AnsiballZ).

zipimport compiles each module from source at every import and keeps no bytecode, so each task on a host spends
most of its CPU compiling ansible.module_utils.basic and the collection's module_utils again (about 0.15 s of the
0.25 s of a ``file`` task on a 2-core CI machine). Keyed by the interpreter's bytecode magic, the source and its
path inside the zip, a cached code object is exactly what compiling that source gives; only the file name is set
to the zip the module came from this time.
"""

import _frozen_importlib_external
import _imp
import marshal
import os
import zipimport

CACHE_DIR = "/var/cache/llmops-lab-module-code"
_compile_source = zipimport._compile_source


def _cached_compile_source(pathname, source):
    import hashlib

    inside_zip = pathname.rpartition(".zip")[2]
    key = hashlib.sha256(_frozen_importlib_external.MAGIC_NUMBER + inside_zip.encode() + b"\0" + source).hexdigest()
    path = os.path.join(CACHE_DIR, key)
    try:
        with open(path, "rb") as cached:
            code = marshal.loads(cached.read())
    except (OSError, EOFError, ValueError, TypeError):
        code = _compile_source(pathname, source)
        try:
            os.makedirs(CACHE_DIR, mode=0o700, exist_ok=True)
            partial = f"{path}.{os.getpid()}"
            with open(partial, "wb") as out:
                out.write(marshal.dumps(code))
            os.replace(partial, path)
        except OSError:
            pass
        return code
    _imp._fix_co_filename(code, pathname)
    return code


zipimport._compile_source = _cached_compile_source
