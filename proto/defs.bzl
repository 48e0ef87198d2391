"""Generates C++ protobuf and gRPC code with the system protoc.

Bazel 4's native proto_library wants to download protobuf, so these macros
run Debian's protoc (and grpc_cpp_plugin) in a genrule and wrap the outputs
in a cc_library. Messages and services are separate targets, so code that
only needs a message (storage/, rules/) never links gRPC.
"""

def sonde_cc_proto(name, src, deps = [], proto_deps = [], visibility = None):
    """One .proto file's messages -> a cc_library named `name`.

    Args:
      name: the cc_library's name.
      src: the .proto file (in this package).
      deps: cc_library targets generated from the imported .proto files.
      proto_deps: the imported .proto files themselves.
      visibility: visibility of the cc_library.
    """
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    native.genrule(
        name = name + "_gen",
        srcs = [src] + proto_deps,
        outs = outs,
        cmd = "/usr/bin/protoc -I. --cpp_out=$(GENDIR) $(location %s)" % src,
    )
    native.cc_library(
        name = name,
        srcs = [base + ".pb.cc"],
        hdrs = [base + ".pb.h"],
        deps = deps + ["//third_party:protobuf"],
        visibility = visibility,
    )

def sonde_cc_grpc(name, src, proto, proto_deps = [], visibility = None):
    """One .proto file's services -> a cc_library named `name` (stubs and
    service bases), on top of `proto`, the sonde_cc_proto of the same file.

    Args:
      name: the cc_library's name.
      src: the .proto file (in this package).
      proto: the sonde_cc_proto target of `src`.
      proto_deps: the .proto files `src` imports.
      visibility: visibility of the cc_library.
    """
    base = src[:-len(".proto")]
    outs = [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    native.genrule(
        name = name + "_gen",
        srcs = [src] + proto_deps,
        outs = outs,
        cmd = ("/usr/bin/protoc -I. --grpc_out=$(GENDIR) " +
               "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin $(location %s)") % src,
    )
    native.cc_library(
        name = name,
        srcs = [base + ".grpc.pb.cc"],
        hdrs = [base + ".grpc.pb.h"],
        deps = [proto, "//third_party:protobuf", "//third_party:grpc"],
        visibility = visibility,
    )
