"""sonde_py_test: pytest under Debian's /usr/bin/python3, as a Bazel test.

The test's runfiles hold the `sonde` package (rooted at client/python) and
the workspace; run_pytest.sh puts both on PYTHONPATH and writes pytest's
JUnit XML where Bazel wants it, so deploy/test.sh counts the cases.
"""

def sonde_py_test(name, srcs, data = [], size = "medium", tags = [], env = {}):
    native.sh_test(
        name = name,
        size = size,
        srcs = ["//client/python:run_pytest.sh"],
        args = ["$(location %s)" % s for s in srcs],
        data = srcs + data + ["//client/python:sonde", "//client/python/testing:sonde_pytest.py", "//server:sonde-collector"],
        tags = tags,
        env = env,
    )
