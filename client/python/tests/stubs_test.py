"""The generated stubs import as sonde.v1 and reach a real collector."""

import grpc

from sonde.v1 import query_pb2, query_pb2_grpc, tensor_pb2


def test_enums_match_smdebug_mode_numbers():
    assert tensor_pb2.MODE_TRAIN == 1
    assert tensor_pb2.MODE_EVAL == 2
    assert tensor_pb2.MODE_PREDICT == 3
    assert tensor_pb2.MODE_GLOBAL == 4


def test_list_jobs_on_a_fresh_collector(collector):
    with grpc.insecure_channel(collector.address) as channel:
        stub = query_pb2_grpc.QueryStub(channel)
        jobs = stub.ListJobs(query_pb2.ListJobsRequest(), timeout=10)
        assert list(jobs.jobs) == []
        try:
            stub.GetJob(query_pb2.GetJobRequest(job="nope"), timeout=10)
            raise AssertionError("GetJob of an unknown job succeeded")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.NOT_FOUND
            assert "nope" in e.details()


def test_stubs_and_the_extension_agree_in_any_import_order():
    # A sonde.v1 module imported before the extension, another after: with
    # protobuf's C++ backend they disagreed on descriptors until `sonde`
    # loaded the extension first (a message with a field of the earlier
    # module's type could not be built).
    import subprocess
    import sys
    code = ("from sonde.v1 import query_pb2\n"
            "from sonde import _sonde\n"
            "from sonde.v1 import collector_pb2, rule_pb2\n"
            "h = collector_pb2.Hello(job='j', rules=[rule_pb2.RuleSpec(name='r')])\n"
            "assert collector_pb2.Hello.FromString(h.SerializeToString()).rules[0].name == 'r'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_shipped_collector_is_the_default_binary():
    """sonde.collector.binary() names the collector (docs/python.md); in a
    source tree, where nothing is shipped, it says how to get one."""
    import os

    import pytest

    from sonde import collector
    shipped = collector.shipped_path("sonde-collector")
    if os.access(shipped, os.X_OK):
        assert collector.binary() == shipped
    else:
        with pytest.raises(SystemExit, match="sonde-collector is not part of this installation"):
            collector.binary()
