"""Generates C++ protobuf (and optionally gRPC) code with the system protoc.

Bazel 4's native proto_library wants to download protobuf, so this macro runs
Debian's protoc and grpc_cpp_plugin in a genrule and wraps the outputs in a
cc_library.
"""

def sonde_cc_proto(name, src, deps = [], proto_deps = [], grpc = False, visibility = None):
    """One .proto file -> a cc_library named `name`.

    Args:
      name: the cc_library's name.
      src: the .proto file (in this package).
      deps: cc_library targets generated from the imported .proto files.
      proto_deps: the imported .proto files themselves.
      grpc: also generate gRPC service code.
      visibility: visibility of the cc_library.
    """
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    cmd = "/usr/bin/protoc -I. --cpp_out=$(GENDIR)"
    if grpc:
        cmd += " --grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin"
    cmd += " $(location %s)" % src
    native.genrule(
        name = name + "_gen",
        srcs = [src] + proto_deps,
        outs = outs,
        cmd = cmd,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["//third_party:protobuf"] + (["//third_party:grpc"] if grpc else []),
        visibility = visibility,
    )
