"""Offline stand-in for rules_cc: re-exports Bazel 4's native C++ rules.

Bazel 4 asks for @rules_cc even for plain cc_* targets; there is no network
here and Debian's bazel-rules-cc needs a newer Bazel, so this shim exists.
"""

cc_binary = native.cc_binary
cc_library = native.cc_library
cc_test = native.cc_test
cc_import = native.cc_import
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
