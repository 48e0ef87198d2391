"""The headers the extension sonde._sonde is built against: a CPython's and
pybind11's.

@local_python has two header libraries:
  :python    CPython's headers, from $SONDE_PYTHON_INCLUDE (default Debian's
             /usr/include/python3.11, the Python the tests use);
  :pybind11  pybind11's headers, from $SONDE_PYBIND11_INCLUDE (the folder
             holding pybind11/), default none: Debian's pybind11-dev in
             /usr/include.
deploy/build-wheels.sh sets both (with --repo_env) to build one extension
per CPython, with a pybind11 from PyPI new enough for 3.12 and 3.13.
Headers outside the workspace must come in through a repository: Bazel
refuses include paths outside its execution root.
"""

def _impl(ctx):
    python = ctx.os.environ.get("SONDE_PYTHON_INCLUDE", "/usr/include/python3.11")
    pybind11 = ctx.os.environ.get("SONDE_PYBIND11_INCLUDE", "")
    if not ctx.path(python + "/Python.h").exists:
        fail("no Python.h in %s (set SONDE_PYTHON_INCLUDE, or install python3-dev)" % python)
    ctx.symlink(python, "python")
    build = [
        'package(default_visibility = ["//visibility:public"])',
        "",
        "cc_library(",
        '    name = "python",',
        '    hdrs = glob(["python/**/*.h"]),',
        '    includes = ["python"],',
        ")",
        "",
    ]
    if pybind11:
        ctx.symlink(pybind11, "pybind11_include")
        build += [
            "cc_library(",
            '    name = "pybind11",',
            '    hdrs = glob(["pybind11_include/pybind11/**/*.h"]),',
            '    includes = ["pybind11_include"],',
            ")",
        ]
    else:
        build.append('cc_library(name = "pybind11")  # Debian\'s, in /usr/include')
    ctx.file("BUILD", "\n".join(build) + "\n")

python_configure = repository_rule(
    implementation = _impl,
    environ = ["SONDE_PYTHON_INCLUDE", "SONDE_PYBIND11_INCLUDE"],
    local = True,
)
