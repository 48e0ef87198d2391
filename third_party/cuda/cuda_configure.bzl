"""Finds a local CUDA toolkit, so that cuda/ builds its kernels when one is
installed and falls back to a CPU-only build when none is.

The toolkit is looked up at $SONDE_CUDA_PATH (default /usr/local/cuda);
SONDE_CUDA=0 forces the CPU-only build. The generated repository
@local_cuda has:
  defs.bzl   CUDA_ENABLED, NVCC (absolute path), CUDA_VERSION
  :headers   the runtime API headers (for host code calling the runtime)
  :cudart    the static CUDA runtime, which loads the driver at run time, so
             binaries start (and report "no GPU") where there is no driver.
"""

def _impl(ctx):
    root = ctx.os.environ.get("SONDE_CUDA_PATH", "/usr/local/cuda")
    wanted = ctx.os.environ.get("SONDE_CUDA", "1") != "0"
    nvcc = ctx.path(root + "/bin/nvcc")
    cudart = ctx.path(root + "/lib64/libcudart_static.a")
    include = ctx.path(root + "/include")
    enabled = wanted and nvcc.exists and cudart.exists and include.exists
    version = ""
    if enabled:
        result = ctx.execute([str(nvcc), "--version"])
        if result.return_code != 0:
            enabled = False
        else:
            for line in result.stdout.splitlines():
                if "release" in line:
                    version = line.split("release")[1].split(",")[0].strip()
    ctx.file("defs.bzl", "\n".join([
        "CUDA_ENABLED = %s" % ("True" if enabled else "False"),
        "NVCC = %r" % (str(nvcc) if enabled else ""),
        "CUDA_VERSION = %r" % version,
        "",
    ]))
    if enabled:
        ctx.symlink(include, "include")
        ctx.symlink(cudart, "lib/libcudart_static.a")
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "headers",
    hdrs = glob([
        "include/*.h",
        "include/crt/*.h",
        "include/crt/*.hpp",
    ]),
    includes = ["include"],
)

cc_import(
    name = "cudart_static",
    static_library = "lib/libcudart_static.a",
)

cc_library(
    name = "cudart",
    deps = [":cudart_static", ":headers"],
    linkopts = ["-ldl", "-lrt", "-lpthread"],
)
""")
    else:
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

# No CUDA toolkit: empty targets so that dependents still resolve.
cc_library(name = "headers")
cc_library(name = "cudart")
""")

cuda_configure = repository_rule(
    implementation = _impl,
    environ = ["SONDE_CUDA_PATH", "SONDE_CUDA"],
    local = True,
)
